// Command agent is the entrypoint of a sandbox pod's container: it supervises
// warm Python interpreters and serves the agent API (/v1). It also runs on a
// laptop as a local daemon, and as a small CLI:
//
//	agent serve --listen :8080 --token-file /var/run/warmpool/token
//	agent serve --socket ~/.rlm/daemon.sock --workers 4
//	agent exec -c 'print(1)'          # against the daemon, or in-process without one
//	agent exec script.py
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/internal/agent/interpreter"
	"github.com/warmpool/warmpool/internal/agent/isolation"
	"github.com/warmpool/warmpool/internal/agent/procs"
	"github.com/warmpool/warmpool/internal/agent/reaper"
	"github.com/warmpool/warmpool/internal/agent/server"
	"github.com/warmpool/warmpool/internal/agent/workspace"
	"github.com/warmpool/warmpool/internal/agentauth"
	"github.com/warmpool/warmpool/pkg/protocol"
)

const usage = `usage:
  agent serve [flags]    serve the agent API on TCP (--listen) or a Unix socket (--socket)
  agent exec [flags] (-c CODE | FILE | -)
                         run code against a running daemon, or in-process when none runs
Run "agent serve -h" or "agent exec -h" for the flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	code := 0
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "exec":
		code, err = execCmd(os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func defaultSocket() string {
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".rlm", "daemon.sock")
}

// interpFlags are the flags of the interpreters, shared by serve and in-process exec.
type interpFlags struct {
	python     string
	preload    string
	workspace  string
	timeout    time.Duration
	grace      time.Duration
	maxOutput  int
	maxTimeout time.Duration
	memory     int64
	processes  int
}

// envInt reads a number the manager passes in the pod's environment.
func envInt(name string) int64 {
	v, _ := strconv.ParseInt(os.Getenv(name), 10, 64)
	return v
}

func (f *interpFlags) register(fs *flag.FlagSet, defaultWorkspace string) {
	fs.StringVar(&f.python, "python", "python3", "Python interpreter to run")
	fs.StringVar(&f.preload, "preload", os.Getenv("WARMPOOL_PRELOAD"), "comma-separated modules to import before ready")
	fs.StringVar(&f.workspace, "workspace", defaultWorkspace, "directory the code runs in and the file API serves")
	fs.DurationVar(&f.timeout, "default-timeout", protocol.DefaultTimeout, "timeout of executions that do not set one")
	fs.DurationVar(&f.grace, "grace", protocol.DefaultGrace, "time interrupted code has to stop before the interpreter is killed")
	fs.IntVar(&f.maxOutput, "max-output-bytes", 128*1024, "most bytes of stdout and of stderr kept per execution")
	fs.DurationVar(&f.maxTimeout, "max-timeout", 24*time.Hour, "largest timeout a request may ask for")
	fs.Int64Var(&f.memory, "memory-limit", envInt("WARMPOOL_MEMORY_LIMIT"),
		"bytes of memory the code may use: each process's address space and all processes' resident memory together (0: no limit)")
	fs.IntVar(&f.processes, "max-processes", int(envInt("WARMPOOL_MAX_PROCESSES")),
		"processes and threads the sandbox user may have, the agent's included (RLIMIT_NPROC; 0: no limit)")
}

func (f *interpFlags) interpreter(log logr.Logger) *interpreter.Interpreter {
	var preload []string
	for _, m := range strings.Split(f.preload, ",") {
		if m = strings.TrimSpace(m); m != "" {
			preload = append(preload, m)
		}
	}
	return interpreter.New(interpreter.Config{
		Python: f.python, Preload: preload, Dir: f.workspace, Log: log,
		DefaultTimeout: f.timeout, DefaultGrace: f.grace, DefaultMaxOutputBytes: f.maxOutput,
		Limits: interpreter.Limits{MemoryBytes: f.memory, Processes: f.processes},
	})
}

func serve(args []string) error {
	// One processor: the agent relays a run's output and answers a few
	// requests, and at idle each extra processor is an OS thread that wakes
	// to look for work, which under gVisor the sentry pays for. GOMAXPROCS in
	// the environment still decides.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", ":8080", "TCP address to serve on (ignored with --socket)")
	socket := fs.String("socket", "", "serve on this Unix socket (mode 0600) instead of TCP")
	tokenFile := fs.String("token-file", "", "file with the bearer token (else $WARMPOOL_AGENT_TOKEN)")
	trustedKeys := fs.String("trusted-keys", os.Getenv("WARMPOOL_TRUSTED_KEYS"),
		"accept tokens signed by these manager keys (ID=BASE64,...) for this pod only, instead of a shared token")
	podUID := fs.String("pod-uid", os.Getenv("WARMPOOL_POD_UID"), "this pod's UID: the audience tokens must name (with --trusted-keys)")
	noAuth := fs.Bool("insecure-no-auth", false, "serve TCP without a token (never in a cluster)")
	workers := fs.Int("workers", 1, "number of interpreters; requests go to a free one")
	verbose := fs.Int("v", 0, "log verbosity")
	terminationLog := fs.String("termination-log", "/dev/termination-log", "where to write why the agent gave up (the pod's termination message)")
	egressCanary := fs.String("egress-canary", os.Getenv("WARMPOOL_EGRESS_CANARY"),
		"host:port the pool's NetworkPolicy must block: not ready until a dial to it fails")
	egressWait := fs.Duration("egress-canary-timeout", 2*time.Minute, "give up (exit) when the canary is still reachable after this long")
	scratchDirs := fs.String("scratch-dirs", "", "comma-separated directories emptied with the workspace when the sandbox passes to another user (in a pod: /tmp)")
	var ifl interpFlags
	ifl.register(fs, "/workspace")
	_ = fs.Parse(args)

	log := logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.Level(-*verbose)}))
	token := os.Getenv("WARMPOOL_AGENT_TOKEN")
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("read token: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	var verify func(string) error
	if *trustedKeys != "" {
		v, err := agentauth.NewVerifier(*trustedKeys, *podUID)
		if err != nil {
			return err
		}
		verify = v.Verify
	}
	if token == "" && verify == nil && *socket == "" && !*noAuth {
		return errors.New("serving TCP needs --trusted-keys and --pod-uid, a token (--token-file or $WARMPOOL_AGENT_TOKEN), or --insecure-no-auth")
	}
	if *workers < 1 {
		return errors.New("--workers must be at least 1")
	}
	if *socket != "" && ifl.workspace == "/workspace" {
		ifl.workspace = filepath.Join(filepath.Dir(*socket), "workspace")
	}
	if *socket != "" {
		switch daemonAnswers(*socket) {
		case socketLive:
			return fmt.Errorf("an agent already serves %s: stop it first, or serve another --socket", *socket)
		case socketStale:
			log.Info("replacing a stale socket that no agent answers on", "socket", *socket)
		}
	}
	ws, err := workspace.Open(ifl.workspace)
	if err != nil {
		return err
	}

	// Out of the code's reach (docs/security.md): not dumpable, so code of
	// the same user can neither trace the agent nor read its memory through
	// /proc (on Linux not its environment nor descriptors either); the
	// interpreter runs in namespaces of its own where the kernel allows
	// (internal/agent/interpreter).
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		log.Info("could not make the agent undumpable", "err", err.Error())
	}
	// No process of the sandbox gains a privilege by exec (a setuid binary, file
	// capabilities), whatever the runtime did with allowPrivilegeEscalation
	// (gVisor did not set it): inherited by the interpreter and every command.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		log.Info("could not set no-new-privileges", "err", err.Error())
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// Orphans of user code are re-parented to the agent: it is PID 1 in a pod and
	// a child subreaper elsewhere, so that it can end them with their interpreter
	// (internal/agent/interpreter/procs.go). It reaps those that exit by themselves.
	procs.BecomeSubreaper()
	go reaper.Run(ctx)

	var interps []*interpreter.Interpreter
	for i := 0; i < *workers; i++ {
		it := ifl.interpreter(log.WithValues("worker", i))
		interps = append(interps, it)
		go func() {
			err := it.Start()
			if err == nil {
				_, err = it.Ready() // a failed preload
			}
			if err != nil {
				// A sandbox whose interpreter cannot start (a preload that does not
				// import, no python) is useless: end the container with the reason,
				// which the kubelet keeps as the pod's termination message, the
				// pool reports as Degraded and waiting Executions repeat.
				log.Error(err, "interpreter start", "worker", i)
				exitWith(*terminationLog, fmt.Sprintf("interpreter %d cannot start: %v", i, err))
			}
		}()
	}
	defer func() {
		for _, it := range interps {
			it.Close()
		}
	}()

	canary := isolation.Start(ctx, *egressCanary, *egressWait, log, func(msg string) {
		log.Error(nil, msg)
		exitWith(*terminationLog, msg)
	})
	srv := server.New(server.Config{
		Token: token, Verify: verify, Workers: interps, Workspace: ws, DefaultTimeout: ifl.timeout, DefaultGrace: ifl.grace,
		MaxOutputBytes: ifl.maxOutput, MaxTimeout: ifl.maxTimeout, Isolation: canary, Log: log,
		ScratchDirs: splitList(*scratchDirs),
		// PID 1: a pod's container, where every other process is the code's.
		Sandbox: os.Getpid() == 1,
	})
	var ln net.Listener
	if *socket != "" {
		if err := os.MkdirAll(filepath.Dir(*socket), 0o700); err != nil {
			return err
		}
		_ = os.Remove(*socket) // stale (checked before anything started)
		old := syscall.Umask(0o177)
		ln, err = net.Listen("unix", *socket)
		syscall.Umask(old)
		if err == nil {
			err = os.Chmod(*socket, 0o600)
		}
	} else {
		ln, err = net.Listen("tcp", *listen)
	}
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	log.Info("agent serving", "addr", ln.Addr().String(), "workers", *workers, "workspace", ifl.workspace)
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	if *socket != "" {
		_ = os.Remove(*socket)
	}
	return nil
}

// execCmd runs code once and prints what it printed; the exit code says how it ended.
func execCmd(args []string) (int, error) {
	fs := flag.NewFlagSet("exec", flag.ExitOnError)
	code := fs.String("c", "", "code to run")
	socket := fs.String("socket", defaultSocket(), "daemon socket")
	url := fs.String("url", "", "agent URL (http://host:port) instead of the socket")
	tokenFile := fs.String("token-file", "", "bearer token file (else $WARMPOOL_AGENT_TOKEN)")
	inProcess := fs.Bool("in-process", false, "run in a fresh interpreter in this process, even if a daemon runs")
	shellLang := fs.Bool("shell", false, "run the code with /bin/sh instead of Python")
	timeout := fs.Duration("timeout", 0, "timeout (default: the agent's)")
	session := fs.String("session", "", "daemon session whose interpreter keeps state between calls")
	var ifl interpFlags
	cwd, _ := os.Getwd()
	ifl.register(fs, cwd)
	_ = fs.Parse(args)

	src := *code
	if src == "" {
		if fs.NArg() != 1 {
			return 2, errors.New("give code with -c, a file, or - for stdin")
		}
		var b []byte
		var err error
		if fs.Arg(0) == "-" {
			b, err = io.ReadAll(os.Stdin)
		} else {
			b, err = os.ReadFile(fs.Arg(0))
		}
		if err != nil {
			return 2, err
		}
		src = string(b)
	}
	req := protocol.ExecuteRequest{ID: fmt.Sprintf("cli-%d", time.Now().UnixNano()), Code: src,
		TimeoutMillis: timeout.Milliseconds(), Session: *session}
	if *shellLang {
		req.Language = protocol.LanguageShell
	}
	token := os.Getenv("WARMPOOL_AGENT_TOKEN")
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return 2, err
		}
		token = strings.TrimSpace(string(b))
	}

	printEvent := func(ev protocol.Event) {
		switch ev.Type {
		case protocol.EventStdout:
			_, _ = os.Stdout.WriteString(ev.Data)
		case protocol.EventStderr:
			_, _ = os.Stderr.WriteString(ev.Data)
		}
	}
	var res *protocol.Result
	var err error
	var c *client.Client
	switch {
	case *url != "":
		c = client.New(*url, token)
	case !*inProcess:
		switch daemonAnswers(*socket) {
		case socketLive:
			c = client.NewUnix(*socket, token)
		case socketStale:
			fmt.Fprintf(os.Stderr, "agent: no daemon answers on %s (a stale socket: its agent ended); running in-process. "+
				"Start one with `agent serve --socket %s`, which replaces the socket.\n", *socket, *socket)
		}
	}
	if c != nil {
		res, err = c.ExecuteStream(context.Background(), req, printEvent)
	} else {
		if req.Language == protocol.LanguageShell {
			return 2, errors.New("--shell needs a daemon")
		}
		it := ifl.interpreter(logr.Discard())
		defer it.Close()
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT)
		defer stop()
		go func() { <-ctx.Done(); it.Interrupt() }()
		res, err = it.Execute(req, interpreter.Hooks{
			OnStdout: func(b []byte) { _, _ = os.Stdout.Write(b) },
			OnStderr: func(b []byte) { _, _ = os.Stderr.Write(b) },
		})
	}
	if err != nil {
		return 1, err
	}
	if res.Result != nil {
		fmt.Println(*res.Result)
	}
	if res.Error != nil {
		if res.Error.Traceback != "" {
			fmt.Fprint(os.Stderr, res.Error.Traceback)
		} else {
			fmt.Fprintf(os.Stderr, "%s: %s\n", res.Error.Type, res.Error.Message)
		}
	}
	switch res.Status {
	case protocol.StatusSucceeded:
		return 0, nil
	case protocol.StatusTimedOut:
		return 124, nil
	case protocol.StatusInterrupted:
		return 130, nil
	}
	if res.ExitCode != nil {
		return *res.ExitCode, nil
	}
	return 1, nil
}

// socketState is what answers on a daemon's socket.
type socketState int

const (
	socketNone  socketState = iota // no socket: no daemon
	socketLive                     // a daemon answers
	socketStale                    // a socket nobody listens on (its agent ended without removing it)
)

// daemonAnswers says whether a daemon listens on socket.
func daemonAnswers(socket string) socketState {
	fi, err := os.Stat(socket)
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		return socketNone
	}
	conn, err := net.DialTimeout("unix", socket, 2*time.Second)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return socketStale
		}
		return socketLive // it exists and did not refuse: let the request say what is wrong
	}
	_ = conn.Close()
	return socketLive
}

// exitWith ends the agent for a reason a person must act on: the reason goes
// to the termination log (best effort: outside a pod it may not exist) and,
// as the last line, to stderr.
func exitWith(terminationLog, reason string) {
	if terminationLog != "" {
		_ = os.WriteFile(terminationLog, []byte(reason), 0o644)
	}
	fmt.Fprintln(os.Stderr, reason)
	os.Exit(1)
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
