package kubectlplugin

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// Ways to run code.
const (
	viaAuto      = "auto"
	viaSession   = "session"
	viaExecution = "execution"
)

type runOptions struct {
	code, file     string
	pool, session  string
	timeout        time.Duration
	contextFile    string
	contextFormat  string
	language       string
	via            string
	keepExecution  bool
	sessionTimeout time.Duration
	saveResults    string
}

func (p *plugin) runCommand() *cobra.Command {
	o := &runOptions{}
	cmd := &cobra.Command{
		Use:   "run (-c CODE | -f FILE | -) (--pool POOL | --session SESSION)",
		Short: "Run code in a warm sandbox and print its output and result",
		Long: `Run code in a warm sandbox of a SandboxPool and print what it wrote to stdout and
stderr, then its result (the repr of a trailing expression, or FINAL()).

With --session, the code runs in that Session (its interpreter keeps state between runs),
through the Sessions data plane, with its output streamed as it is written; with --pool as
well, a Session of that name that does not exist yet is created (yours alone) and kept. Without it,
--via auto (the default) uses a temporary Session when the cluster serves the data plane
(data.warmpool.dev) and an Execution object otherwise; --via execution always creates an
Execution, whose status keeps the output (kubectl warmpool logs NAME).

Ctrl-C interrupts the code (KeyboardInterrupt) and waits for it to stop.

Exit codes: 0 succeeded, 1 the code failed (an exception, a non-zero shell exit, a limit
it hit), 2 usage, 3 timed out, 4 cancelled, 5 the sandbox was lost, 6 anything else.`,
		Example: `  kubectl warmpool run --pool python -c 'print(1)'
  kubectl warmpool run --pool python -f analysis.py --timeout 2m --context-file data.json --context-format json
  echo 'import sys; sys.version' | kubectl warmpool run --pool python -
  kubectl warmpool run --pool python --session scratch -c 'x = 41'; kubectl warmpool run --session scratch -c 'x + 1'`,
		Args: args(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			if len(a) == 1 {
				if a[0] != "-" || o.file != "" {
					return usagef("the only argument run takes is -, for code on stdin")
				}
				o.file = "-"
			}
			return p.run(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.code, "code", "c", "", "the code to run")
	f.StringVarP(&o.file, "filename", "f", "", "file with the code to run (- for stdin)")
	f.StringVar(&o.pool, "pool", "", "SandboxPool whose sandbox runs the code")
	f.StringVar(&o.session, "session", "", "Session to run the code in (created and kept when it does not exist and --pool names its pool)")
	f.DurationVar(&o.timeout, "timeout", 0, "interrupt the code after this long (default: the pool's)")
	f.StringVar(&o.contextFile, "context-file", "", "file whose content becomes the code's `context` variable")
	f.StringVar(&o.contextFormat, "context-format", "text", "text (context is a str) or json (the parsed value)")
	f.StringVar(&o.language, "language", "python", "python or shell")
	f.StringVar(&o.via, "via", viaAuto, "auto, session (a temporary Session) or execution (an Execution object)")
	f.BoolVar(&o.keepExecution, "keep", true, "keep the Execution object after it finished (--via execution; it expires with the pool's TTL)")
	f.DurationVar(&o.sessionTimeout, "wait-timeout", 5*time.Minute, "how long to wait for a sandbox")
	f.StringVar(&o.saveResults, "save-results", "", "write the code's rich results (charts as .png, tables as .html...) into this directory, as result-N.EXT")
	return cmd
}

func (p *plugin) run(ctx context.Context, o *runOptions) error {
	code, err := o.readCode(ctx, p.streams.In)
	if err != nil {
		return err
	}
	switch {
	case o.pool == "" && o.session == "":
		return usagef("name a pool (--pool) or a Session (--session)")
	case o.contextFormat != "text" && o.contextFormat != "json":
		return usagef("--context-format is text or json, not %q", o.contextFormat)
	case o.language != "python" && o.language != "shell":
		return usagef("--language is python or shell, not %q", o.language)
	case o.via != viaAuto && o.via != viaSession && o.via != viaExecution:
		return usagef("--via is auto, session or execution, not %q", o.via)
	case o.session != "" && o.via == viaExecution:
		return usagef("--session runs in a Session: --via execution does not apply")
	case o.saveResults != "" && o.via == viaExecution:
		return usagef("--save-results needs a Session (an Execution keeps no chart or table): leave out --via execution")
	}
	var contextText *string
	if o.contextFile != "" {
		data, err := os.ReadFile(o.contextFile)
		if err != nil {
			return usagef("--context-file: %v", err)
		}
		s := string(data)
		if o.contextFormat == "json" && !json.Valid(data) {
			return usagef("--context-file %s is not valid JSON (--context-format json)", o.contextFile)
		}
		contextText = &s
	}
	ns, err := p.namespace()
	if err != nil {
		return exitWith(ExitOther, err)
	}

	// Ctrl-C (the end of ctx: cmd/kubectl-warmpool turns the first one into
	// it from the start) interrupts the run, or ends the wait for one.
	if o.session == "" {
		via := o.via
		if via == viaAuto {
			via = viaExecution
			why := p.dataPlane(ctx)
			switch {
			case why == nil:
				via = viaSession
			case ctx.Err() != nil:
				return exitWith(ExitCancelled, errors.New("interrupted before the code was sent"))
			default:
				// Say so: an Execution waits for the controllers, which is
				// slower, and a data plane that should be there is worth a look.
				fmt.Fprintf(p.streams.ErrOut, "note: running the code as an Execution object, not through a Session: %v "+
					"(--via execution chooses this path, --via session fails instead)\n", why)
			}
		}
		if via == viaExecution {
			c, err := p.client()
			if err != nil {
				return exitWith(ExitOther, err)
			}
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: o.pool}, &sandboxv1alpha1.SandboxPool{}); err != nil {
				if apierrors.IsNotFound(err) {
					return exitWith(ExitOther, fmt.Errorf("SandboxPool %q not found in namespace %s", o.pool, ns))
				}
				return exitWith(ExitOther, fmt.Errorf("read SandboxPool %s: %w", o.pool, err))
			}
			return p.runExecution(ctx, c, ns, code, contextText, o)
		}
		// The one-call run checks the pool itself (404 naming it): no read first.
	}
	return p.runInSession(ctx, ns, code, contextText, o)
}

func (o *runOptions) readCode(ctx context.Context, stdin io.Reader) (string, error) {
	switch {
	case o.code != "" && o.file != "":
		return "", usagef("give the code once: -c or -f, not both")
	case o.code != "":
		return o.code, nil
	case o.file == "-":
		type read struct {
			data []byte
			err  error
		}
		done := make(chan read, 1)
		go func() {
			data, err := io.ReadAll(stdin)
			done <- read{data, err}
		}()
		select {
		case <-ctx.Done(): // a Ctrl-C at a terminal that waits for the code
			return "", exitWith(ExitCancelled, errors.New("interrupted before the code was read"))
		case r := <-done:
			if r.err != nil {
				return "", fmt.Errorf("read stdin: %w", r.err)
			}
			return string(r.data), nil
		}
	case o.file != "":
		data, err := os.ReadFile(o.file)
		if err != nil {
			return "", usagef("%v", err)
		}
		return string(data), nil
	}
	return "", usagef("no code: use -c CODE, -f FILE, or - for stdin")
}

// dataPlane returns nil when the cluster serves the Sessions data plane, or
// why not (not installed, or installed but not answering).
func (p *plugin) dataPlane(ctx context.Context) error {
	cfg, err := p.restConfig()
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	gv := sessions.Group + "/" + sessions.Version
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = dc.RESTClient().Get().AbsPath("/apis", sessions.Group, sessions.Version).Do(ctx).Error()
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("the cluster does not serve %s (the data plane is not installed)", gv)
	case apierrors.IsServiceUnavailable(err):
		return fmt.Errorf("the data plane (%s) is installed but not answering (kubectl get apiservice v1alpha1.%s; "+
			"kubectl -n warmpool-system get pods): %v", gv, sessions.Group, err)
	}
	return fmt.Errorf("the data plane (%s) could not be asked: %v", gv, err)
}

// runInSession runs the code in the named Session, or in a temporary one of
// the pool, streaming its output.
func (p *plugin) runInSession(ctx context.Context, ns, code string, contextText *string, o *runOptions) error {
	cfg, err := p.restConfig()
	if err != nil {
		return exitWith(ExitOther, err)
	}
	sc, err := sessions.New(cfg)
	if err != nil {
		return exitWith(ExitOther, err)
	}
	req := sessions.ExecRequest{Code: code, Language: o.language, TimeoutMillis: o.timeout.Milliseconds()}
	if contextText != nil {
		req.Context = contextValue(*contextText, o.contextFormat)
	}
	handlers := sessions.Handlers{
		OnStdout: func(d string) { p.writeOut(d) },
		OnStderr: func(d string) { _, _ = io.WriteString(p.streams.ErrOut, d) },
	}
	if o.session == "" {
		// One request: the data plane leases a warm interpreter for a
		// temporary Session, runs the code and closes the Session. The
		// Session is this command's alone: nobody else in the namespace may
		// run code in it or read what the code left there.
		res, s, err := sc.RunOnce(ctx, ns, sessions.RunRequest{Pool: o.pool, ExecRequest: req, OwnerOnly: true,
			WaitMillis: o.sessionTimeout.Milliseconds()}, handlers)
		var notRun *sessions.NotRunError
		switch {
		case err != nil && ctx.Err() != nil && errors.As(err, &notRun):
			return exitWith(ExitCancelled, errors.New("interrupted before the code ran"))
		case err != nil && ctx.Err() != nil:
			return exitWith(ExitCancelled, errors.New("interrupted"))
		case errors.As(err, &notRun):
			return exitWith(ExitOther, fmt.Errorf("temporary Session: %w", err))
		case err != nil:
			return exitWith(sessionEndCode(context.Background(), s), fmt.Errorf("run in temporary Session %s: %w", s.Name, err))
		}
		if err := p.saveResults(o.saveResults, res); err != nil {
			return err
		}
		return p.report(outcome{status: string(res.Status), result: res.Result, err: resultError(res.Error)}, "")
	}
	s := sc.Open(ns, o.session)
	res, err := s.RunStream(ctx, req, handlers)
	if sessions.IsStatus(err, http.StatusNotFound) && ctx.Err() == nil {
		if o.pool == "" {
			return exitWith(ExitOther, fmt.Errorf("Session %q not found in namespace %s: name a pool (--pool) to create it", o.session, ns))
		}
		// Created by this run, leased and run in one request, and kept for
		// the next run: it closes after its idle timeout or when closed
		// (kubectl warmpool sessions close NAME).
		var created *sessions.Session
		res, created, err = sc.RunOnce(ctx, ns, sessions.RunRequest{Pool: o.pool, ExecRequest: req, Session: o.session, Keep: true,
			OwnerOnly: true, WaitMillis: o.sessionTimeout.Milliseconds()}, handlers)
		var notRun *sessions.NotRunError
		if errors.As(err, &notRun) && sessions.IsStatus(err, http.StatusConflict) {
			// Someone else created it meanwhile: run in it.
			res, err = s.RunStream(ctx, req, handlers)
		} else if err == nil || !errors.As(err, &notRun) {
			fmt.Fprintf(p.streams.ErrOut, "session.sandbox.warmpool.dev/%s created (pool %s; kubectl warmpool sessions close %s)\n",
				o.session, o.pool, o.session)
			if created != nil {
				s = created
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return exitWith(ExitCancelled, errors.New("interrupted"))
		}
		return exitWith(sessionEndCode(context.Background(), s), fmt.Errorf("run in Session %s: %w", s.Name, err))
	}
	if err := p.saveResults(o.saveResults, res); err != nil {
		return err
	}
	return p.report(outcome{
		status: string(res.Status), result: res.Result, err: resultError(res.Error),
	}, "")
}

// resultExtensions are the file extensions of the rich results' formats
// --save-results writes; text/plain is printed, not saved.
var resultExtensions = map[string]string{
	"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/svg+xml": "svg", "application/pdf": "pdf",
	"text/html": "html", "text/markdown": "md", "text/latex": "tex", "application/json": "json",
}

// saveResults writes each rich result's formats into dir as result-N.EXT
// (N from 1, in the run's order) and says on stderr what it wrote, and which
// files the run left in the sandbox.
func (p *plugin) saveResults(dir string, res *sessions.Result) error {
	if dir == "" || res == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return exitWith(ExitOther, fmt.Errorf("--save-results: %w", err))
	}
	for i, d := range res.Displays {
		mimes := make([]string, 0, len(d.Data))
		for m := range d.Data {
			mimes = append(mimes, m)
		}
		sort.Strings(mimes)
		for _, m := range mimes {
			ext, ok := resultExtensions[m]
			if !ok {
				continue
			}
			data := []byte(d.Data[m])
			var text string
			if m != "application/json" && json.Unmarshal(d.Data[m], &text) == nil {
				data = []byte(text)
				if slices.Contains(protocol.BinaryMIMETypes, m) {
					if data, ok = decodeBase64(text); !ok {
						continue
					}
				}
			}
			name := filepath.Join(dir, fmt.Sprintf("result-%d.%s", i+1, ext))
			if err := os.WriteFile(name, data, 0o644); err != nil {
				return exitWith(ExitOther, fmt.Errorf("--save-results: %w", err))
			}
			fmt.Fprintf(p.streams.ErrOut, "saved %s (%s, %d bytes)\n", name, m, len(data))
		}
	}
	for _, f := range res.Files {
		fmt.Fprintf(p.streams.ErrOut, "the code wrote %s (%d bytes) in the sandbox\n", f.Path, f.Size)
	}
	return nil
}

func decodeBase64(s string) ([]byte, bool) {
	b, err := base64.StdEncoding.DecodeString(s)
	return b, err == nil
}

// sessionEndCode is 5 when the Session is Lost (its sandbox went away), else
// 6. The run's stream can break before the manager has stored the Session's
// end, so a Session still Ready is asked again for a few seconds.
func sessionEndCode(ctx context.Context, s *sessions.Session) int {
	if s == nil {
		return ExitOther
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		obj, err := s.Get(ctx)
		switch {
		case err == nil && obj.Status.Phase == sandboxv1alpha1.SessionLost:
			return ExitSandboxLost
		case err == nil && obj.Status.Phase.IsFinished():
			return ExitOther
		}
		select {
		case <-ctx.Done():
			return ExitOther
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// contextValue is the data plane's JSON context for a --context-file.
func contextValue(text, format string) json.RawMessage {
	if format == "json" {
		return json.RawMessage(text)
	}
	data, _ := json.Marshal(text)
	return data
}

func resultError(e *sessions.ResultError) *sandboxv1alpha1.ExecutionError {
	if e == nil {
		return nil
	}
	return &sandboxv1alpha1.ExecutionError{Type: e.Type, Message: e.Message, Traceback: e.Traceback}
}

// runExecution creates an Execution, waits for its final status and prints it.
func (p *plugin) runExecution(ctx context.Context, c client.WithWatch, ns, code string, contextText *string, o *runOptions) error {
	ex := &sandboxv1alpha1.Execution{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "run-"},
		Spec: sandboxv1alpha1.ExecutionSpec{
			PoolRef:  sandboxv1alpha1.ParsePoolReference(o.pool),
			Code:     &code,
			Language: sandboxv1alpha1.Language(o.language),
			Context:  contextText,
		},
	}
	if contextText != nil {
		ex.Spec.ContextFormat = sandboxv1alpha1.ContextFormat(o.contextFormat)
	}
	if o.timeout > 0 {
		ex.Spec.Timeout = &metav1.Duration{Duration: o.timeout}
	}
	// Recorded when kube-apiserver says who the caller is (kubectl auth whoami).
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, review); err == nil {
		ex.Spec.Owner = review.Status.UserInfo.Username
	}
	if err := c.Create(ctx, ex); err != nil {
		return exitWith(ExitOther, fmt.Errorf("create Execution: %w", err))
	}
	fmt.Fprintf(p.streams.ErrOut, "execution.sandbox.warmpool.dev/%s created\n", ex.Name)
	if !o.keepExecution {
		defer func() { _ = c.Delete(context.Background(), ex) }()
	}
	done, err := waitFinished(ctx, c, client.ObjectKeyFromObject(ex))
	if err != nil && ctx.Err() != nil {
		// Ctrl-C: cancel it, and wait (not for ever) for the code to stop.
		if err := setCancel(context.Background(), c, ex); err != nil {
			return exitWith(ExitOther, fmt.Errorf("cancel Execution %s: %w", ex.Name, err))
		}
		waitCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done, err = waitFinished(waitCtx, c, client.ObjectKeyFromObject(ex))
	}
	if err != nil {
		return exitWith(ExitOther, fmt.Errorf("wait for Execution %s: %w", ex.Name, err))
	}
	return p.printExecution(done)
}

// waitFinished polls the Execution until its phase is final.
func waitFinished(ctx context.Context, c client.Client, key client.ObjectKey) (*sandboxv1alpha1.Execution, error) {
	for {
		ex := &sandboxv1alpha1.Execution{}
		if err := c.Get(ctx, key, ex); err != nil {
			return nil, err
		}
		if ex.Status.Phase.IsFinished() {
			return ex, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func setCancel(ctx context.Context, c client.Client, ex *sandboxv1alpha1.Execution) error {
	return c.Patch(ctx, ex, client.RawPatch(mergePatch, []byte(`{"spec":{"cancel":true}}`)))
}

// printExecution prints a finished Execution's output and result and returns its exit code.
func (p *plugin) printExecution(ex *sandboxv1alpha1.Execution) error {
	writeLine(p.streams.Out, strings.TrimSuffix(ex.Status.Stdout, "\n"))
	writeLine(p.streams.ErrOut, strings.TrimSuffix(ex.Status.Stderr, "\n"))
	reason := ""
	for _, c := range ex.Status.Conditions {
		if c.Type == sandboxv1alpha1.ExecutionConditionComplete {
			reason = c.Reason
		}
	}
	var result *string
	if ex.Status.Result != "" {
		result = &ex.Status.Result
	}
	return p.report(outcome{phase: ex.Status.Phase, reason: reason, result: result, err: ex.Status.Error}, ex.Name)
}

// outcome is how a run ended, from a data-plane result or an Execution's status.
type outcome struct {
	status string                         // data plane: succeeded, failed, interrupted, timed_out
	phase  sandboxv1alpha1.ExecutionPhase // Execution
	reason string                         // Execution: the Complete condition's reason
	result *string
	err    *sandboxv1alpha1.ExecutionError
}

// report prints the result or the error and returns the run's exit code.
func (p *plugin) report(o outcome, execution string) error {
	if o.result != nil {
		if p.outOpen {
			// The code's output ended mid-line: the result goes on a line of its own.
			p.writeOut("\n")
		}
		writeLine(p.streams.Out, *o.result)
	}
	if o.err != nil {
		msg := o.err.Traceback
		if msg == "" {
			msg = strings.TrimSpace(o.err.Type + ": " + o.err.Message)
		}
		writeLine(p.streams.ErrOut, msg)
	}
	code := exitCodeOf(o)
	if code == ExitSucceeded {
		return nil
	}
	if execution != "" && code != ExitCodeFailed {
		return exitWith(code, fmt.Errorf("execution %s ended %s (%s)", execution, o.phase, o.reason))
	}
	return exitWith(code, nil)
}

// Reasons of a Failed Execution that mean the code itself failed (it
// raised, exited non-zero or hit a limit of its sandbox), and those that
// mean the sandbox went away under it.
var (
	codeFailures = map[string]bool{
		sandboxv1alpha1.ReasonError: true, sandboxv1alpha1.ReasonMemoryLimitExceeded: true,
		sandboxv1alpha1.ReasonProcessLimitReached: true, sandboxv1alpha1.ReasonDiskLimitReached: true,
		sandboxv1alpha1.ReasonOOMKilled: true, protocol.ErrorInterpreterDied: true,
	}
	sandboxLosses = map[string]bool{
		sandboxv1alpha1.ReasonSandboxLost: true, sandboxv1alpha1.ReasonSessionLost: true, sandboxv1alpha1.ReasonEvicted: true,
	}
)

func exitCodeOf(o outcome) int {
	switch protocol.Status(o.status) {
	case sessions.StatusSucceeded:
		return ExitSucceeded
	case sessions.StatusTimedOut:
		return ExitTimedOut
	case sessions.StatusInterrupted:
		return ExitCancelled
	case sessions.StatusFailed:
		if o.err != nil && o.err.Type == protocol.ErrorInterpreterRestarted {
			return ExitSandboxLost // the Session's state was gone; the code did not run
		}
		return ExitCodeFailed
	}
	switch o.phase {
	case sandboxv1alpha1.PhaseSucceeded:
		return ExitSucceeded
	case sandboxv1alpha1.PhaseTimedOut:
		return ExitTimedOut
	case sandboxv1alpha1.PhaseCancelled:
		return ExitCancelled
	case sandboxv1alpha1.PhaseFailed:
		switch {
		case codeFailures[o.reason]:
			return ExitCodeFailed
		case sandboxLosses[o.reason]:
			return ExitSandboxLost
		}
	}
	return ExitOther
}
