package kinds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

// Defaults of ExecConfig.
const (
	DefaultExecGrace     = 10 * time.Second
	DefaultExecTailBytes = 4096
	// DefaultExecFailureTailBytes is how much of the end of each stream an
	// attempt that failed keeps: enough for a stack trace or a compiler's
	// errors, and both streams fit task.MaxResultBytes.
	DefaultExecFailureTailBytes = 64 << 10
)

// outputDrainTimeout bounds how long the handler keeps reading a child's
// output once its whole process group is dead. Only a process that left the
// group (setsid) can still hold the pipes open then, and the attempt must
// not wait for it.
const outputDrainTimeout = 2 * time.Second

// fallbackPath is the child's PATH when the node itself has none.
const fallbackPath = "/usr/local/bin:/usr/bin:/bin"

// ErrNotAllowed is wrapped by every refusal to run an executable: the node
// allows none, or not this one. Retrying on the same node cannot help, so
// the refusal also wraps task.ErrNoRetry: the node fails such a task at once
// instead of using up its attempts.
var ErrNotAllowed = errors.New("exec is not allowed on this node")

// NotAllowedError is a refusal to run an executable. It wraps ErrNotAllowed
// and task.ErrNoRetry.
type NotAllowedError struct {
	Argv0   string   // the refused executable; "" when the node allows none
	Allowed []string // the node's allow list, as the operator wrote it
}

func (e *NotAllowedError) Error() string {
	const hint = "allow it in the node's kinds.ExecConfig.Allowed"
	if len(e.Allowed) == 0 {
		return fmt.Sprintf("%v: it allows no executable (%s)", ErrNotAllowed, hint)
	}
	return fmt.Sprintf("%v: %q is not among the allowed executables [%s] (%s)",
		ErrNotAllowed, e.Argv0, strings.Join(e.Allowed, " "), hint)
}

func (e *NotAllowedError) Unwrap() []error { return []error{ErrNotAllowed, task.ErrNoRetry} }

// ExecConfig configures the exec kind.
type ExecConfig struct {
	// Allowed lists the executables a task may run, as names looked up in
	// the node's PATH ("sh") or paths ("/usr/local/bin/backup"). Empty
	// allows nothing: every exec task fails.
	Allowed []string
	// Grace is how long a stopped child has between SIGTERM and SIGKILL.
	// Zero or less means DefaultExecGrace.
	Grace time.Duration
	// TailBytes is how much of the end of stdout, and of stderr, is kept
	// for the result of a child that succeeded. Zero or less means
	// DefaultExecTailBytes.
	TailBytes int
	// FailureTailBytes is as much for a child that failed, was killed or
	// was stopped: the operator who finds it failed reads why there. Zero
	// or less means DefaultExecFailureTailBytes. The result never passes
	// task.MaxResultBytes: tails that would, once encoded, are cut.
	FailureTailBytes int
	// AllowedEnv lists the environment variables a payload may set. Empty
	// allows none: a task whose payload sets any fails without running.
	// Names that make common programs run code of the submitter's choosing
	// (LD_PRELOAD, BASH_ENV, PATH, PYTHONPATH, ...) are refused by Validate
	// even here; see docs/exec.md.
	AllowedEnv []string
	// User, when set, is the account every child runs as, with no
	// supplementary group. It needs the node to run as root. Nil runs
	// children as the node's own user.
	User *ExecUser
}

// Validate checks the configuration: every AllowedEnv name is valid and
// none is dangerous, and a User can be switched to. The errors name the
// offending value; a node should refuse to start on one.
func (c ExecConfig) Validate() error {
	if err := validateAllowedEnv(c.AllowedEnv); err != nil {
		return err
	}
	return validateExecUser(c.User)
}

// ExecPayload is the payload of an exec task:
// {"argv":["/bin/echo","hi"],"env":{"K":"V"},"dir":"/tmp"}.
type ExecPayload struct {
	// Argv is the command line; Argv[0] must be allowed on the node.
	Argv []string `json:"argv"`
	// Env adds to the child's minimal environment (see Exec). Every name
	// must be in the node's ExecConfig.AllowedEnv.
	Env map[string]string `json:"env,omitempty"`
	// Dir is the child's working directory; "" is the node's.
	Dir string `json:"dir,omitempty"`
}

// Kind is "exec": an ExecPayload is the arguments of an exec task
// (flotilla.SubmitArgs).
func (ExecPayload) Kind() string { return "exec" }

// ExecResult is the result of an exec task, set on t.Result whenever the
// child ran, whether it succeeded or not; the node keeps it with the
// attempt's end either way, and the dashboard shows it. The failure's error
// also carries the last line of stderr.
type ExecResult struct {
	// ExitCode is the child's exit status, or -1 when a signal ended it.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that ended the child ("SIGSEGV"), if any.
	Signal   string `json:"signal,omitempty"`
	Stdout   string `json:"stdout"` // the last TailBytes of stdout (FailureTailBytes after a failure)
	Stderr   string `json:"stderr"` // the last TailBytes of stderr (FailureTailBytes after a failure)
	Duration string `json:"duration"`
}

// RegisterExec registers the exec kind on a node. It is registered even when
// cfg allows nothing, so that exec tasks routed to this node fail with a
// clear error instead of waiting for a node that serves the kind.
func RegisterExec(n *node.Node, cfg ExecConfig) {
	n.Register("exec", Exec(cfg))
}

// Exec returns the handler of the exec kind: it runs the payload's command
// in a child process, and succeeds when the child exits with status 0.
//
// The child gets a minimal environment, not the node's (which may hold
// secrets such as FLOTILLA_DSN): the node's PATH and HOME (the User's home
// when cfg has a User), then the payload's env, then the attempt's
// identity: FLOTILLA_TASK_ID, FLOTILLA_ATTEMPT, FLOTILLA_CLAIM_SEQ and
// FLOTILLA_EPOCH, so that the child can fence its own side effects. The
// payload may set only the names in cfg.AllowedEnv; a task that sets any
// other fails with an *EnvNotAllowedError before anything runs, since the
// environment is the easiest way to make an allowed program run another
// (BASH_ENV, LD_PRELOAD, PATH, ...).
//
// A cfg that Validate refuses fails every task with Validate's error and
// runs nothing: a node should check it at start instead.
//
// The child leads a process group of its own. When the handler's context
// ends (a stop, a timeout, a lost lease, shutdown), the group gets SIGTERM,
// then SIGKILL after the grace period, and the handler returns the context's
// cause. Whatever way the child ends, the group then gets SIGKILL, so that no
// grandchild outlives the attempt. On Linux the kernel also kills the child
// should the node die (kill -9); that covers the direct child only, not its
// own children, and nothing covers a process that left the group (setsid).
func Exec(cfg ExecConfig) node.Handler {
	return newExecRunner(cfg).run
}

type execRunner struct {
	cfg ExecConfig
	// invalid is Validate's verdict on cfg, returned by every task.
	invalid error
	// started, when set, is told the process group of every child at its
	// start. Tests use it to look for survivors.
	started func(pgid int)
}

func newExecRunner(cfg ExecConfig) *execRunner {
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultExecGrace
	}
	if cfg.TailBytes <= 0 {
		cfg.TailBytes = DefaultExecTailBytes
	}
	if cfg.FailureTailBytes <= 0 {
		cfg.FailureTailBytes = DefaultExecFailureTailBytes
	}
	cfg.Allowed = slices.Clone(cfg.Allowed)
	cfg.AllowedEnv = slices.Clone(cfg.AllowedEnv)
	if cfg.User != nil {
		u := *cfg.User
		cfg.User = &u
	}
	r := &execRunner{cfg: cfg}
	if err := cfg.Validate(); err != nil {
		r.invalid = task.NoRetry(err)
	}
	return r
}

func (r *execRunner) run(ctx context.Context, t *task.Task) error {
	if r.invalid != nil {
		return r.invalid
	}
	// Refuse before reading the payload: a node that allows nothing has
	// nothing to say about the command.
	if len(r.cfg.Allowed) == 0 {
		return &NotAllowedError{}
	}
	var p ExecPayload
	if err := decode(t, &p); err != nil {
		return err
	}
	if len(p.Argv) == 0 || p.Argv[0] == "" {
		return fmt.Errorf(`exec: payload %s has no command: it needs "argv":["/path/to/program", ...]`, t.Payload)
	}
	path, err := r.allowedPath(p.Argv[0], p.Dir)
	if err != nil {
		return err
	}
	if err := checkPayloadEnv(p.Env, r.cfg.AllowedEnv); err != nil {
		return err
	}
	env := r.childEnv(t, p.Env)
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return r.runChild(ctx, t, path, p, env)
}

// allowedPath returns the absolute path of argv0 when the allow list
// contains it, and a *NotAllowedError otherwise. Both sides are resolved the
// same way, so that "sh" on the list allows "sh", "/bin/sh" and
// "/usr/bin/sh" alike. The path returned is the one to run: the child's own
// PATH (which the payload may set) cannot swap in another program.
func (r *execRunner) allowedPath(argv0, dir string) (string, error) {
	path, err := resolveExecutable(argv0, dir)
	if err != nil {
		if slices.Contains(r.cfg.Allowed, argv0) {
			return "", fmt.Errorf("exec: %q is allowed but cannot be run: %w", argv0, err)
		}
		// Unresolvable and not on the list: say "not allowed", so that a
		// task cannot probe which files exist on the node.
		return "", &NotAllowedError{Argv0: argv0, Allowed: r.cfg.Allowed}
	}
	for _, entry := range r.cfg.Allowed {
		// Entries are resolved at every task, not once, so that a program
		// installed after the node started is found.
		if resolved, err := resolveExecutable(entry, ""); err == nil && resolved == path {
			return path, nil
		}
	}
	return "", &NotAllowedError{Argv0: argv0, Allowed: r.cfg.Allowed}
}

// resolveExecutable turns a command name into the absolute path that runs:
// a bare name through the node's PATH, a relative path against dir (where
// the child will run). Symbolic links among the directories are resolved
// (/bin -> usr/bin) but not the file's own: a multi-call binary such as
// busybox picks its behaviour by the name it is run as, so allowing "sh"
// must not allow "rm" just because both link to the same file.
func resolveExecutable(name, dir string) (string, error) {
	path := name
	switch {
	case !strings.Contains(name, "/"):
		found, err := exec.LookPath(name)
		if err != nil {
			return "", err
		}
		path = found
	case !filepath.IsAbs(name) && dir != "":
		path = filepath.Join(dir, name)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", err
	}
	return filepath.Join(parent, filepath.Base(abs)), nil
}

// childEnv builds the child's environment from a payload env that
// checkPayloadEnv has let through: see Exec.
func (r *execRunner) childEnv(t *task.Task, extra map[string]string) []string {
	vars := map[string]string{"PATH": os.Getenv("PATH")}
	if vars["PATH"] == "" {
		vars["PATH"] = fallbackPath
	}
	if r.cfg.User != nil {
		vars["HOME"] = r.cfg.User.Home
	} else if home, ok := os.LookupEnv("HOME"); ok {
		vars["HOME"] = home
	}
	maps.Copy(vars, extra)
	vars["FLOTILLA_TASK_ID"] = strconv.FormatInt(t.ID, 10)
	vars["FLOTILLA_ATTEMPT"] = strconv.Itoa(t.Attempt)
	vars["FLOTILLA_CLAIM_SEQ"] = strconv.FormatInt(t.ClaimSeq, 10)
	vars["FLOTILLA_EPOCH"] = strconv.FormatInt(t.Epoch, 10)

	env := make([]string, 0, len(vars))
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		env = append(env, k+"="+vars[k])
	}
	return env
}

// runChild runs the child to its end and reports the outcome; see Exec.
func (r *execRunner) runChild(ctx context.Context, t *task.Task, path string, p ExecPayload, env []string) error {
	argv0 := p.Argv[0]
	// The child writes into pipes of our own rather than exec.Cmd's: Cmd.Wait
	// would wait for every holder of the pipes, grandchildren included,
	// before the group could be killed.
	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("exec %s: %w", argv0, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(outR, outW)
		return fmt.Errorf("exec %s: %w", argv0, err)
	}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        p.Argv,
		Env:         env,
		Dir:         p.Dir,
		Stdout:      outW,
		Stderr:      errW,
		SysProcAttr: childProcAttr(r.cfg.User),
	}
	begun := time.Now()
	startErr := cmd.Start()
	// The child has its own copies of the write ends; ours must go, or the
	// readers would never see the end of the output.
	closeAll(outW, errW)
	if startErr != nil {
		closeAll(outR, errR)
		return fmt.Errorf("exec %s: %w", argv0, startErr)
	}
	pgid := cmd.Process.Pid // Setpgid with Pgid 0: the child leads a group named by its pid
	if r.started != nil {
		r.started(pgid)
	}

	keep := max(r.cfg.TailBytes, r.cfg.FailureTailBytes)
	stdout := &tailBuffer{limit: keep}
	stderr := &tailBuffer{limit: keep}
	var readers sync.WaitGroup
	readers.Go(func() { _, _ = io.Copy(stdout, outR) })
	readers.Go(func() { _, _ = io.Copy(stderr, errR) })

	exited := make(chan exitWait, 1)
	go func() {
		reaped, err := awaitExit(cmd)
		exited <- exitWait{reaped: reaped, err: err}
	}()

	var (
		ended   exitWait
		stopped bool // the group was signalled because ctx ended
	)
	select {
	case ended = <-exited:
	case <-ctx.Done():
		stopped = true
		ended = stopGroup(pgid, r.cfg.Grace, exited)
	}
	// Whatever ended the leader, nothing of its group may outlive the
	// attempt: a grandchild may ignore SIGTERM, or have been left running
	// in the background.
	signalGroup(pgid, syscall.SIGKILL)
	if !ended.reaped {
		ended.err = cmd.Wait()
	}
	drain(&readers, outR, errR)
	closeAll(outR, errR)

	status, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	res := ExecResult{
		ExitCode: cmd.ProcessState.ExitCode(),
		Duration: time.Since(begun).Round(time.Millisecond).String(),
	}
	if status.Signaled() {
		res.Signal = signalName(status.Signal())
	}
	tail := r.cfg.TailBytes
	if stopped || ended.err != nil || status.Signaled() {
		tail = r.cfg.FailureTailBytes
	}
	t.Result = boundedResult(res, stdout, stderr, tail)

	switch {
	case stopped:
		return context.Cause(ctx)
	case status.Signaled():
		return fmt.Errorf("exec %s: killed by signal %s (%v)%s", argv0, res.Signal, status.Signal(), lastLine(stderr.String()))
	case ended.err != nil:
		// *exec.ExitError reads "exit status 3".
		return fmt.Errorf("exec %s: %w%s", argv0, ended.err, lastLine(stderr.String()))
	}
	return nil
}

// boundedResult encodes res with the last tail bytes of each stream, cut
// further while the encoding passes task.MaxResultBytes: JSON spells a
// control byte in six, so a binary stream can grow sixfold.
func boundedResult(res ExecResult, stdout, stderr *tailBuffer, tail int) json.RawMessage {
	for ; tail > 0; tail /= 2 {
		res.Stdout, res.Stderr = stdout.Tail(tail), stderr.Tail(tail)
		if out, err := json.Marshal(res); err == nil && len(out) <= task.MaxResultBytes {
			return out
		}
	}
	res.Stdout, res.Stderr = "", ""
	out, _ := json.Marshal(res) // strings and ints always encode
	return out
}

type exitWait struct {
	reaped bool // Cmd.Wait has run; otherwise the child is a zombie still
	err    error
}

// awaitExit blocks until the child has exited. Where the platform can,
// exec_linux.go leaves the child unreaped (reaped false): while it is a
// zombie its pid, which names its process group, cannot be reused by an
// unrelated process, so the group kill that follows cannot hit a stranger.
var awaitExit = func(cmd *exec.Cmd) (reaped bool, err error) {
	return true, cmd.Wait()
}

// tieToNode, set by exec_linux.go, asks the kernel to kill the child when
// the node dies. Other systems have no such request.
var tieToNode = func(*syscall.SysProcAttr) {}

// childProcAttr makes the child the leader of a new process group, so that
// it and everything it starts can be signalled at once, and runs it as u
// when u is set.
func childProcAttr(u *ExecUser) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: true}
	if u != nil {
		attr.Credential = u.credential()
	}
	tieToNode(attr)
	return attr
}

// stopGroup asks the group to end (SIGTERM), forces it (SIGKILL) if the
// leader has not exited after grace, and returns once the leader has exited.
func stopGroup(pgid int, grace time.Duration, exited <-chan exitWait) exitWait {
	signalGroup(pgid, syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case ended := <-exited:
		return ended
	case <-timer.C:
		signalGroup(pgid, syscall.SIGKILL)
		return <-exited
	}
}

// signalGroup signals every process of a group. ESRCH (the group is empty)
// is the outcome sought; no other error can be helped here.
func signalGroup(pgid int, sig syscall.Signal) {
	_ = syscall.Kill(-pgid, sig)
}

// drain waits for the output readers to reach the end of the pipes, for at
// most outputDrainTimeout, then makes them stop.
func drain(readers *sync.WaitGroup, pipes ...*os.File) {
	done := make(chan struct{})
	go func() {
		readers.Wait()
		close(done)
	}()
	timer := time.NewTimer(outputDrainTimeout)
	defer timer.Stop()
	select {
	case <-done:
		return
	case <-timer.C:
	}
	for _, f := range pipes {
		if err := f.SetReadDeadline(time.Now()); err != nil {
			_ = f.Close()
		}
	}
	<-done
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// lastLine returns ": " and the last non-empty line of s, shortened, for an
// error message; "" when s has none.
func lastLine(s string) string {
	const maxLen = 200
	s = strings.TrimRight(s, "\r\n\t ")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if s == "" {
		return ""
	}
	if len(s) > maxLen {
		s = trimBrokenRune(s[len(s)-maxLen:])
	}
	return ": " + s
}

// signalNames names the signals a child is likely to die of.
var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP:  "SIGHUP",
	syscall.SIGINT:  "SIGINT",
	syscall.SIGQUIT: "SIGQUIT",
	syscall.SIGILL:  "SIGILL",
	syscall.SIGTRAP: "SIGTRAP",
	syscall.SIGABRT: "SIGABRT",
	syscall.SIGBUS:  "SIGBUS",
	syscall.SIGFPE:  "SIGFPE",
	syscall.SIGKILL: "SIGKILL",
	syscall.SIGUSR1: "SIGUSR1",
	syscall.SIGSEGV: "SIGSEGV",
	syscall.SIGUSR2: "SIGUSR2",
	syscall.SIGPIPE: "SIGPIPE",
	syscall.SIGALRM: "SIGALRM",
	syscall.SIGTERM: "SIGTERM",
	syscall.SIGXCPU: "SIGXCPU",
	syscall.SIGXFSZ: "SIGXFSZ",
	syscall.SIGSYS:  "SIGSYS",
}

func signalName(sig syscall.Signal) string {
	if name, ok := signalNames[sig]; ok {
		return name
	}
	return "signal " + strconv.Itoa(int(sig))
}

// tailBuffer keeps the last limit bytes written to it, in at most twice that
// much memory: a child may write gigabytes, the result needs only the end.
type tailBuffer struct {
	limit int
	buf   []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= b.limit {
		b.buf = append(b.buf[:0], p[len(p)-b.limit:]...)
		return n, nil
	}
	// Shift the kept bytes down only when the buffer would pass twice the
	// limit, so that many small writes cost amortised constant time.
	if len(b.buf)+len(p) > 2*b.limit {
		keep := b.limit - len(p)
		b.buf = b.buf[:copy(b.buf, b.buf[len(b.buf)-keep:])]
	}
	b.buf = append(b.buf, p...)
	return n, nil
}

// String returns the tail as valid UTF-8 without NUL: a rune cut by the
// start of the tail is dropped, and any other invalid byte (binary output)
// becomes U+FFFD, as does NUL, which PostgreSQL's jsonb refuses (\u0000):
// a result holding one could not be stored, and the attempt could not end.
func (b *tailBuffer) String() string { return b.Tail(b.limit) }

// Tail is String of the last n bytes, at most the limit.
func (b *tailBuffer) Tail(n int) string {
	tail := b.buf
	if n = min(n, b.limit); len(tail) > n {
		tail = tail[len(tail)-n:]
	}
	return strings.ReplaceAll(strings.ToValidUTF8(trimBrokenRune(string(tail)), "\uFFFD"), "\x00", "\uFFFD")
}

// trimBrokenRune drops the continuation bytes that open s when a cut went
// through a rune: at most utf8.UTFMax-1 of them, since more cannot belong
// to one rune.
func trimBrokenRune(s string) string {
	for i := 0; i < utf8.UTFMax-1 && len(s) > 0 && !utf8.RuneStart(s[0]); i++ {
		s = s[1:]
	}
	return s
}
