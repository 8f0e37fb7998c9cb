package kinds

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/flotilla-dev/flotilla/task"
)

// ErrEnvNotAllowed is wrapped by every refusal of a payload's environment
// variable: the node allows none, or not this one. Like ErrNotAllowed, the
// refusal also wraps task.ErrNoRetry.
var ErrEnvNotAllowed = errors.New("exec environment variable is not allowed on this node")

// EnvNotAllowedError is the refusal of an exec task whose payload sets an
// environment variable the operator has not allowed. It wraps
// ErrEnvNotAllowed and task.ErrNoRetry. The value is left out: it may be a
// secret, and it may be the attack.
type EnvNotAllowedError struct {
	Name    string   // the refused variable
	Allowed []string // the node's ExecConfig.AllowedEnv
}

func (e *EnvNotAllowedError) Error() string {
	const hint = "allow it in the node's kinds.ExecConfig.AllowedEnv"
	if len(e.Allowed) == 0 {
		return fmt.Sprintf("%v: payload env sets %q and the node allows no variable (%s)", ErrEnvNotAllowed, e.Name, hint)
	}
	return fmt.Sprintf("%v: payload env sets %q, not among the allowed variables [%s] (%s)",
		ErrEnvNotAllowed, e.Name, strings.Join(e.Allowed, " "), hint)
}

func (e *EnvNotAllowedError) Unwrap() []error { return []error{ErrEnvNotAllowed, task.ErrNoRetry} }

// ErrDangerousEnv is wrapped by the refusal of an ExecConfig whose
// AllowedEnv names a variable that makes common programs load or run code
// of the submitter's choosing: see docs/exec.md.
var ErrDangerousEnv = errors.New("environment variable can make the child run arbitrary code")

// DangerousEnvError names the variable of AllowedEnv that the node refuses
// to let a payload set, whatever the operator allows.
type DangerousEnvError struct {
	Name   string
	Reason string
}

func (e *DangerousEnvError) Error() string {
	return fmt.Sprintf("exec: ExecConfig.AllowedEnv names %s, which is refused: %v (%s); see docs/exec.md", e.Name, ErrDangerousEnv, e.Reason)
}

func (e *DangerousEnvError) Unwrap() error { return ErrDangerousEnv }

// dangerousEnv lists, by exact name, the variables no payload may set. Each
// makes a widespread program load a library, read a startup file, or run a
// command named by the value. The list cannot be complete; the allow list
// (AllowedEnv) is the defence, this list keeps an operator from opening the
// best-known holes by mistake. docs/exec.md gives the reasons at length.
var dangerousEnv = map[string]string{
	"ENV":               "POSIX shells source the file it names",
	"PATH":              "it picks which program a bare command name runs",
	"IFS":               "it changes how shells split words",
	"SHELLOPTS":         "it turns on shell options such as xtrace, which expands PS4",
	"BASHOPTS":          "it turns on bash options",
	"PS4":               "bash expands it, command substitutions included, under xtrace",
	"PROMPT_COMMAND":    "bash runs it before a prompt",
	"CDPATH":            "it changes where cd goes",
	"GLOBIGNORE":        "it changes what globs match",
	"ZDOTDIR":           "zsh sources its startup files from there",
	"HOME":              "programs read their configuration (~/.gitconfig, ~/.ssh/config, ...) from there; the node sets it",
	"XDG_CONFIG_HOME":   "programs read their configuration from there",
	"TMPDIR":            "it moves files a program believes private into a directory of the submitter's choosing",
	"PERL5LIB":          "perl loads modules from there",
	"PERL5OPT":          "perl takes options from it, -M (load a module) included",
	"PERLLIB":           "perl loads modules from there",
	"RUBYOPT":           "ruby takes options from it, -r (require a file) included",
	"RUBYLIB":           "ruby loads libraries from there",
	"NODE_OPTIONS":      "node takes options from it, --require included",
	"NODE_PATH":         "node loads modules from there",
	"JAVA_TOOL_OPTIONS": "the JVM takes options from it, -javaagent included",
	"_JAVA_OPTIONS":     "the JVM takes options from it, -javaagent included",
	"JDK_JAVA_OPTIONS":  "the java launcher takes options from it",
	"CLASSPATH":         "the JVM loads classes from there",
	"GCONV_PATH":        "glibc loads character-set modules from there",
	"GLIBC_TUNABLES":    "glibc's loader parses it (CVE-2023-4911)",
	"LOCPATH":           "glibc loads locale data from there",
	"NLSPATH":           "message catalogues are read from there",
	"HOSTALIASES":       "the resolver reads host aliases from the file it names",
	"LOCALDOMAIN":       "it changes the resolver's search domains",
	"RES_OPTIONS":       "it changes the resolver's options",
	"LUA_INIT":          "lua runs it, or the file it names, at start",
	"PHPRC":             "php reads its configuration from there",
	"EDITOR":            "programs run it as a command",
	"VISUAL":            "programs run it as a command",
	"PAGER":             "programs run it as a command",
	"LESSOPEN":          "less runs it as a command",
	"LESSCLOSE":         "less runs it as a command",
	"SSH_ASKPASS":       "ssh runs it as a command",
	// Libraries and clients that read a file of their own choosing.
	"OPENSSL_CONF":        "OpenSSL reads the configuration it names, which can load engines and providers",
	"OPENSSL_MODULES":     "OpenSSL loads provider modules from there",
	"OPENSSL_ENGINES":     "OpenSSL loads engines from there",
	"SSL_CERT_FILE":       "TLS clients trust the certificates it names: a server of the submitter's choosing passes for any",
	"SSL_CERT_DIR":        "TLS clients trust the certificates there",
	"CURL_CA_BUNDLE":      "curl trusts the certificates it names",
	"REQUESTS_CA_BUNDLE":  "python's requests trusts the certificates it names",
	"NODE_EXTRA_CA_CERTS": "node trusts the certificates it names",
	"SSLKEYLOGFILE":       "TLS libraries write their session keys to the file it names",
	"PSQLRC":              "psql runs the commands of the file it names, \\! (a shell command) included",
	"PGPASSFILE":          "libpq reads passwords from the file it names",
	"PGSERVICEFILE":       "libpq reads connection settings from the file it names",
	"PGSYSCONFDIR":        "libpq reads its service file from there",
	"WGETRC":              "wget reads its configuration, output files included, from the file it names",
	"CURL_HOME":           "curl reads its configuration from there",
	"HTTP_PROXY":          "programs send their requests, and the credentials in them, through the proxy it names",
	"HTTPS_PROXY":         "programs send their requests, and the credentials in them, through the proxy it names",
	"ALL_PROXY":           "programs send their requests through the proxy it names",
	"FTP_PROXY":           "programs send their requests through the proxy it names",
	"NO_PROXY":            "it takes hosts out of the operator's proxy",
	// More interpreters' paths and options.
	"PERL5DB":              "perl -d runs it",
	"GEM_PATH":             "ruby loads gems from there",
	"GEM_HOME":             "ruby loads gems from there",
	"BUNDLE_GEMFILE":       "bundler loads the Gemfile it names, which is ruby",
	"PHP_INI_SCAN_DIR":     "php reads configuration from there",
	"TCLLIBPATH":           "tcl loads packages from there",
	"R_PROFILE":            "R sources the file it names at start",
	"R_PROFILE_USER":       "R sources the file it names at start",
	"R_ENVIRON":            "R reads its environment from the file it names",
	"GOFLAGS":              "go takes flags from it, -toolexec (run a program) included",
	"DOTNET_STARTUP_HOOKS": "the .NET runtime loads the assemblies it names",
}

// dangerousEnvPrefixes lists families of variables no payload may set.
var dangerousEnvPrefixes = []struct{ prefix, reason string }{
	{"LD_", "the dynamic loader obeys it (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT load libraries)"},
	{"DYLD_", "the macOS loader obeys it"},
	{"BASH_", "bash obeys it (BASH_ENV is sourced, BASH_FUNC_* defines functions, BASH_LOADABLES_PATH loads builtins)"},
	{"PYTHON", "python obeys it (PYTHONPATH, PYTHONSTARTUP and PYTHONHOME load code)"},
	{"GIT_", "git obeys it (GIT_SSH_COMMAND, GIT_EXEC_PATH, GIT_CONFIG_* run commands)"},
	{"LUA_", "lua loads modules from there"},
	{"CORECLR_", "the .NET runtime loads the profiler it names (CORECLR_PROFILER_PATH)"},
	{"FLOTILLA_", "the attempt's identity is the node's to set, and no other FLOTILLA_ variable is the payload's"},
}

// dangerousEnvReason returns why a payload must never set name, or "" when
// the name is none of the dangerous ones. Names are compared in upper case:
// the lower-case spellings do nothing on Linux, but refusing them costs
// nothing and keeps the rule simple on systems whose environment ignores
// case.
func dangerousEnvReason(name string) string {
	upper := strings.ToUpper(name)
	if strings.Contains(name, "%%") {
		return "bash imports a variable named BASH_FUNC_<name>%% as a function that replaces a command"
	}
	if reason, ok := dangerousEnv[upper]; ok {
		return reason
	}
	for _, p := range dangerousEnvPrefixes {
		if strings.HasPrefix(upper, p.prefix) {
			return p.reason
		}
	}
	return ""
}

// checkEnvName refuses a name that no environment can hold.
func checkEnvName(name string) error {
	if name == "" || strings.ContainsAny(name, "=\x00") {
		return fmt.Errorf("%q is not a valid environment variable name: it must be non-empty, without '=' or NUL", name)
	}
	return nil
}

// validateAllowedEnv checks the operator's AllowedEnv.
func validateAllowedEnv(names []string) error {
	for _, name := range names {
		if err := checkEnvName(name); err != nil {
			return fmt.Errorf("exec: ExecConfig.AllowedEnv: %w", err)
		}
		if reason := dangerousEnvReason(name); reason != "" {
			return &DangerousEnvError{Name: name, Reason: reason}
		}
	}
	return nil
}

// checkPayloadEnv refuses a payload's env unless every name in it is
// allowed and every value can be passed to a child. It runs before anything
// is started, and its refusals are not worth retrying: the payload will not
// change.
func checkPayloadEnv(env map[string]string, allowed []string) error {
	for _, name := range slices.Sorted(maps.Keys(env)) {
		if err := checkEnvName(name); err != nil {
			return task.NoRetry(fmt.Errorf("exec: payload env: %w", err))
		}
		if !slices.Contains(allowed, name) {
			return &EnvNotAllowedError{Name: name, Allowed: allowed}
		}
		if strings.ContainsRune(env[name], 0) {
			return task.NoRetry(fmt.Errorf("exec: payload env %q: the value holds a NUL byte, which no environment can carry", name))
		}
	}
	return nil
}
