package kinds

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/task"
)

// envTrick is a payload env that would make the allowed script below run
// code of the submitter's: here, create the marker file.
type envTrick struct {
	name  string
	env   map[string]string
	fires bool // the trick works against the script when nothing stops it
}

// injectionBundle is an allowed bash script that prints a greeting and runs
// one program by its bare name, as harmless scripts do, and the tricks that
// would turn it into anything.
type injectionBundle struct {
	script string // the allowed script
	marker string // what injected code creates
	tricks []envTrick
}

func setupInjection(t *testing.T) *injectionBundle {
	t.Helper()
	dir := t.TempDir()
	b := &injectionBundle{script: filepath.Join(dir, "greet.sh"), marker: filepath.Join(dir, "pwned")}
	writeExecutable(t, b.script, "#!/bin/bash\necho hello ${GREETING:-}\ndate > /dev/null\n")
	// A directory of the submitter's: a date that creates the marker, a
	// python module and a shared object that would do the same.
	evil := filepath.Join(dir, "evil")
	if err := os.Mkdir(evil, 0o755); err != nil {
		t.Fatal(err)
	}
	touch := "touch " + b.marker
	writeExecutable(t, filepath.Join(evil, "date"), "#!/bin/sh\n"+touch+"\n")
	writeExecutable(t, filepath.Join(evil, "site.py"), "import os\nos.system('"+touch+"')\n")
	substitution := "$(" + touch + ")"
	b.tricks = []envTrick{
		// bash expands BASH_ENV, command substitutions included, and
		// sources the result before a script.
		{name: "BASH_ENV", env: map[string]string{"BASH_ENV": substitution}, fires: true},
		// POSIX shells (sh, bash as sh, ksh) do the same with ENV when
		// interactive.
		{name: "ENV", env: map[string]string{"ENV": substitution}},
		// bash imports BASH_FUNC_<name>%% as a function, which takes the
		// place of the echo builtin.
		{name: "BASH_FUNC_echo%%", env: map[string]string{"BASH_FUNC_echo%%": "() { " + touch + "; }"}, fires: true},
		{name: "LD_PRELOAD", env: map[string]string{"LD_PRELOAD": filepath.Join(evil, "evil.so")}},
		// The script's date becomes the submitter's.
		{name: "PATH", env: map[string]string{"PATH": evil + ":" + os.Getenv("PATH")}, fires: true},
		{name: "PYTHONPATH", env: map[string]string{"PYTHONPATH": evil}},
		{name: "GIT_SSH_COMMAND", env: map[string]string{"GIT_SSH_COMMAND": touch}},
		{name: "IFS", env: map[string]string{"IFS": "/"}},
		// xtrace prints PS4 before each command, expanding it first. Since
		// 4.4, bash ignores PS4 from the environment when it runs as root.
		{name: "SHELLOPTS+PS4", env: map[string]string{"SHELLOPTS": "xtrace", "PS4": substitution}, fires: os.Geteuid() != 0},
	}
	return b
}

func writeExecutable(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
}

func (b *injectionBundle) assertNoMarker(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(b.marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("injected code ran: stat %s: %v", b.marker, err)
	}
}

// TestExecEnvTricksAreReal runs the script as the node would if it passed
// the payload's env on: the tricks marked as firing do run code, so the
// refusals below guard against something real.
func TestExecEnvTricksAreReal(t *testing.T) {
	inj := setupInjection(t)
	for _, trick := range inj.tricks {
		if !trick.fires {
			continue
		}
		t.Run(trick.name, func(t *testing.T) {
			t.Cleanup(func() { _ = os.Remove(inj.marker) })
			cmd := exec.Command(inj.script)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
			for k, v := range trick.env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", inj.script, err, out)
			}
			if _, err := os.Stat(inj.marker); err != nil {
				t.Errorf("the trick did not fire: %v", err)
			}
		})
	}
}

func TestExecRefusesEveryEnvTrick(t *testing.T) {
	inj := setupInjection(t)
	b := setupExec(t, ExecConfig{Allowed: []string{inj.script}, AllowedEnv: []string{"GREETING"}})
	for _, trick := range inj.tricks {
		t.Run(trick.name, func(t *testing.T) {
			tk := execTask(t, ExecPayload{Argv: []string{inj.script}, Env: trick.env})
			err := b.run(t, tk)
			var refusal *EnvNotAllowedError
			if !errors.As(err, &refusal) || !errors.Is(err, ErrEnvNotAllowed) || !errors.Is(err, task.ErrNoRetry) {
				t.Fatalf("err = %v, want an *EnvNotAllowedError, not worth retrying", err)
			}
			if !strings.Contains(trick.name, refusal.Name) {
				t.Errorf("refused %q, want one of %s", refusal.Name, trick.name)
			}
			for _, want := range []string{`"` + refusal.Name + `"`, "[GREETING]", "kinds.ExecConfig.AllowedEnv"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err %q does not say %s", err, want)
				}
			}
			for _, v := range trick.env {
				if strings.Contains(err.Error(), v) {
					t.Errorf("err %q repeats the refused value %q", err, v)
				}
			}
			b.assertNothingStarted(t)
			inj.assertNoMarker(t)
			if tk.Result != nil {
				t.Errorf("result %s, want none: nothing ran", tk.Result)
			}
		})
	}
}

func TestExecPassesAnAllowedEnvVariable(t *testing.T) {
	inj := setupInjection(t)
	b := setupExec(t, ExecConfig{Allowed: []string{inj.script}, AllowedEnv: []string{"GREETING"}})
	tk := execTask(t, ExecPayload{Argv: []string{inj.script}, Env: map[string]string{"GREETING": "world"}})
	if err := b.run(t, tk); err != nil {
		t.Fatal(err)
	}
	if got := execResult(t, tk).Stdout; got != "hello world\n" {
		t.Errorf("the script printed %q, want %q", got, "hello world\n")
	}
	inj.assertNoMarker(t)
}

func TestExecRefusesAnyEnvWhenNoneIsAllowed(t *testing.T) {
	inj := setupInjection(t)
	b := setupExec(t, ExecConfig{Allowed: []string{inj.script}})
	err := b.run(t, execTask(t, ExecPayload{Argv: []string{inj.script}, Env: map[string]string{"GREETING": "world"}}))
	if !errors.Is(err, ErrEnvNotAllowed) || !strings.Contains(err.Error(), `sets "GREETING" and the node allows no variable`) {
		t.Fatalf("err = %v, want a refusal of GREETING saying no variable is allowed", err)
	}
	b.assertNothingStarted(t)
}

func TestExecRefusesANulInAnAllowedValue(t *testing.T) {
	inj := setupInjection(t)
	b := setupExec(t, ExecConfig{Allowed: []string{inj.script}, AllowedEnv: []string{"GREETING"}})
	err := b.run(t, execTask(t, ExecPayload{Argv: []string{inj.script}, Env: map[string]string{"GREETING": "a\x00b"}}))
	if !errors.Is(err, task.ErrNoRetry) || !strings.Contains(err.Error(), `"GREETING": the value holds a NUL byte`) {
		t.Fatalf("err = %v, want a refusal of the NUL byte, not worth retrying", err)
	}
	b.assertNothingStarted(t)
}

func TestExecConfigRefusesDangerousAllowedEnv(t *testing.T) {
	for _, name := range []string{
		"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "DYLD_INSERT_LIBRARIES",
		"BASH_ENV", "ENV", "BASH_FUNC_echo%%", "BASH_FUNC_echo", "echo%%", "BASH_LOADABLES_PATH",
		"PATH", "IFS", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "CDPATH", "GLOBIGNORE", "ZDOTDIR",
		"PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME",
		"PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYOPT", "RUBYLIB", "NODE_OPTIONS", "NODE_PATH",
		"JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH",
		"GIT_SSH_COMMAND", "GIT_EXEC_PATH", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_COUNT",
		"GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS",
		"HOME", "XDG_CONFIG_HOME", "TMPDIR", "LUA_INIT", "PHPRC", "EDITOR", "PAGER", "LESSOPEN", "SSH_ASKPASS",
		"FLOTILLA_TASK_ID", "FLOTILLA_EPOCH", "FLOTILLA_DSN",
		"OPENSSL_CONF", "OPENSSL_MODULES", "OPENSSL_ENGINES", "SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE",
		"REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "SSLKEYLOGFILE", "PSQLRC", "PGPASSFILE", "PGSERVICEFILE", "PGSYSCONFDIR",
		"WGETRC", "CURL_HOME", "HTTP_PROXY", "https_proxy", "ALL_PROXY", "FTP_PROXY", "NO_PROXY",
		"PERL5DB", "GEM_PATH", "GEM_HOME", "BUNDLE_GEMFILE", "PHP_INI_SCAN_DIR", "TCLLIBPATH", "R_PROFILE", "R_PROFILE_USER",
		"R_ENVIRON", "GOFLAGS", "DOTNET_STARTUP_HOOKS", "CORECLR_PROFILER_PATH",
		"ld_preload", "Path",
	} {
		t.Run(name, func(t *testing.T) {
			err := ExecConfig{AllowedEnv: []string{"GREETING", name}}.Validate()
			var refusal *DangerousEnvError
			if !errors.As(err, &refusal) || !errors.Is(err, ErrDangerousEnv) {
				t.Fatalf("Validate() = %v, want a *DangerousEnvError", err)
			}
			if want := "ExecConfig.AllowedEnv names " + name + ", which is refused"; !strings.Contains(err.Error(), want) {
				t.Errorf("err %q does not say %q", err, want)
			}
		})
	}
}

func TestExecConfigAcceptsHarmlessAllowedEnv(t *testing.T) {
	err := ExecConfig{AllowedEnv: []string{"GREETING", "LANG", "TZ", "BACKUP_TARGET", "MY_PATH"}}.Validate()
	if err != nil {
		t.Errorf("Validate() = %v, want nil", err)
	}
}

func TestExecConfigRefusesInvalidAllowedEnvNames(t *testing.T) {
	for _, name := range []string{"", "A=B", "A\x00B"} {
		err := ExecConfig{AllowedEnv: []string{name}}.Validate()
		if err == nil || !strings.Contains(err.Error(), "is not a valid environment variable name") {
			t.Errorf("Validate(%q) = %v, want it refused as not a valid name", name, err)
		}
	}
}

// TestExecWithARefusedConfigRunsNothing: a library user who skips Validate
// gets a handler that fails every task with Validate's error.
func TestExecWithARefusedConfigRunsNothing(t *testing.T) {
	inj := setupInjection(t)
	b := setupExec(t, ExecConfig{Allowed: []string{inj.script}, AllowedEnv: []string{"BASH_ENV"}})
	err := b.run(t, execTask(t, ExecPayload{Argv: []string{inj.script}, Env: map[string]string{"BASH_ENV": "$(touch " + inj.marker + ")"}}))
	if !errors.Is(err, ErrDangerousEnv) || !errors.Is(err, task.ErrNoRetry) {
		t.Fatalf("err = %v, want the config's refusal, not worth retrying", err)
	}
	b.assertNothingStarted(t)
	inj.assertNoMarker(t)
}
