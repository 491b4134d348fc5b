package kubectlplugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/kubectlplugin"
	"github.com/warmpool/warmpool/internal/testing/localkubelet"
	"github.com/warmpool/warmpool/internal/testing/stack"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// syncBuffer is written by a running command while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// result of one plugin invocation.
type result struct {
	code           int
	stdout, stderr string
}

// The plugin as a user runs it: a kubeconfig with client certificates and
// the namespace roles of config/rbac, against warmpool on envtest with real
// agents and the data plane registered as an APIService.
func TestPlugin(t *testing.T) {
	ctx := context.Background()
	s := stack.ForTest(t)
	admin := s.Env.Client
	ns, err := s.Namespace(ctx, "plugin-")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WarmPool(ctx, ns, "python", 2); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := s.UserKubeconfig(ctx, ns, "kubectl-user", "session-editor-role", "execution-editor-role", "sandboxpool-viewer-role")
	if err != nil {
		t.Fatal(err)
	}
	runCtx := func(ctx context.Context, stdout, stderr *syncBuffer, args ...string) int {
		args = append(args, "--kubeconfig", kubeconfig, "-n", ns)
		return kubectlplugin.RunContext(ctx, args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: stdout, ErrOut: stderr})
	}
	plugin := func(args ...string) result {
		var out, errOut syncBuffer
		code := runCtx(ctx, &out, &errOut, args...)
		return result{code, out.String(), errOut.String()}
	}
	expect := func(t *testing.T, got result, code int, stdout string, stderrHas ...string) {
		t.Helper()
		if got.code != code || (stdout != "*" && got.stdout != stdout) {
			t.Fatalf("exit %d, stdout %q; want exit %d, stdout %q (stderr %q)", got.code, got.stdout, code, stdout, got.stderr)
		}
		for _, s := range stderrHas {
			if !strings.Contains(got.stderr, s) {
				t.Fatalf("stderr %q does not say %q", got.stderr, s)
			}
		}
	}
	created := regexp.MustCompile(`execution\.sandbox\.warmpool\.dev/(run-[a-z0-9]+) created`)

	t.Run("run through a temporary Session streams output and prints the result", func(t *testing.T) {
		got := plugin("run", "--pool", "python", "-c", "import sys\nprint('hi')\nprint('warn', file=sys.stderr)\n6 * 7")
		expect(t, got, kubectlplugin.ExitSucceeded, "hi\n42\n", "warn\n")
		if created.MatchString(got.stderr) {
			t.Fatalf("auto made an Execution although the data plane is served: %q", got.stderr)
		}
	})

	var firstExecution string
	t.Run("run as an Execution prints the same, and logs prints it again", func(t *testing.T) {
		got := plugin("run", "--via", "execution", "--pool", "python", "-c", "import sys\nprint('hi')\nprint('warn', file=sys.stderr)\n6 * 7")
		expect(t, got, kubectlplugin.ExitSucceeded, "hi\n42\n", "warn\n")
		m := created.FindStringSubmatch(got.stderr)
		if m == nil {
			t.Fatalf("no Execution named on stderr: %q", got.stderr)
		}
		firstExecution = m[1]
		ex := &sandboxv1alpha1.Execution{}
		if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: firstExecution}, ex); err != nil || ex.Spec.Owner != "kubectl-user" {
			t.Fatalf("the Execution must record who created it (spec.owner kubectl-user): %q, %v", ex.Spec.Owner, err)
		}
		expect(t, plugin("logs", firstExecution), 0, "hi\n42\n", "warn\n")
		expect(t, plugin("logs", firstExecution, "--exit-code"), 0, "hi\n42\n")
	})

	t.Run("code that raises exits 1 with its traceback, both ways", func(t *testing.T) {
		for _, via := range []string{"session", "execution"} {
			got := plugin("run", "--via", via, "--pool", "python", "-c", "print('before')\n1/0")
			expect(t, got, kubectlplugin.ExitCodeFailed, "before\n", "ZeroDivisionError", "line 2")
		}
		got := plugin("run", "--via", "execution", "--pool", "python", "--language", "shell", "-c", "echo out; exit 3")
		expect(t, got, kubectlplugin.ExitCodeFailed, "out\n")
	})

	t.Run("--save-results writes each rich result's formats into a directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "results")
		got := plugin("run", "--pool", "python", "--save-results", dir, "-c",
			"class C:\n    def _repr_png_(self): return b'\\x89PNG fake'\n    def _repr_html_(self): return '<b>t</b>'\n"+
				"display(C())\nopen('notes.txt', 'w').write('hi')\nprint('done')")
		expect(t, got, 0, "done\n", "saved "+filepath.Join(dir, "result-1.png")+" (image/png, 9 bytes)",
			"saved "+filepath.Join(dir, "result-1.html"), "the code wrote notes.txt (2 bytes) in the sandbox")
		png, err := os.ReadFile(filepath.Join(dir, "result-1.png"))
		if err != nil || string(png) != "\x89PNG fake" {
			t.Fatalf("result-1.png: %q %v", png, err)
		}
		if html, _ := os.ReadFile(filepath.Join(dir, "result-1.html")); string(html) != "<b>t</b>" {
			t.Fatalf("result-1.html: %q", html)
		}
		expect(t, plugin("run", "--via", "execution", "--pool", "python", "--save-results", dir, "-c", "1"), kubectlplugin.ExitUsage,
			"", "--save-results needs a Session")
	})

	t.Run("a timeout exits 3 with the partial output, both ways", func(t *testing.T) {
		for _, via := range []string{"session", "execution"} {
			got := plugin("run", "--via", via, "--pool", "python", "--timeout", "1s", "-c", "print('working', flush=True)\nwhile True:\n    pass")
			expect(t, got, kubectlplugin.ExitTimedOut, "working\n", "KeyboardInterrupt")
		}
	})

	t.Run("kubectl warmpool cancel ends a running Execution, which exits 4", func(t *testing.T) {
		var out, errOut syncBuffer
		done := make(chan int)
		go func() {
			done <- runCtx(ctx, &out, &errOut, "run", "--via", "execution", "--pool", "python", "-c", "import time\nprint('started', flush=True)\ntime.sleep(60)")
		}()
		var name string
		waitFor(t, func() bool {
			m := created.FindStringSubmatch(errOut.String())
			if m == nil {
				return false
			}
			name = m[1]
			ex := &sandboxv1alpha1.Execution{}
			return admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, ex) == nil && ex.Status.Phase == sandboxv1alpha1.PhaseRunning
		})
		expect(t, plugin("cancel", name), 0, "execution.sandbox.warmpool.dev/"+name+" cancel requested\n")
		code := exitWithin(t, done, 60*time.Second, "the run did not end after its cancel")
		if code != kubectlplugin.ExitCancelled || out.String() != "started\n" {
			t.Fatalf("exit %d, stdout %q; want 4 and the output before the cancel (stderr %q)", code, out.String(), errOut.String())
		}
	})

	t.Run("Ctrl-C interrupts a run in a Session and exits 4", func(t *testing.T) {
		var out, errOut syncBuffer
		cctx, interrupt := context.WithCancel(ctx)
		defer interrupt()
		done := make(chan int)
		go func() {
			done <- runCtx(cctx, &out, &errOut, "run", "--pool", "python", "-c", "import time\nprint('started', flush=True)\ntime.sleep(60)")
		}()
		waitFor(t, func() bool { return out.String() == "started\n" })
		// The temporary Session is the command's alone. (Those of the runs
		// before are closed by the data plane just after their results.)
		live := 0
		waitFor(t, func() bool {
			var list sandboxv1alpha1.SessionList
			if err := admin.List(ctx, &list, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			live = 0
			for _, ses := range list.Items {
				if !strings.HasPrefix(ses.Name, "run-") || ses.Status.Phase.IsFinished() || ses.Spec.Close || ses.DeletionTimestamp != nil {
					continue
				}
				live++
				if ses.Spec.Owner != "kubectl-user" || ses.Spec.Access != sandboxv1alpha1.SessionAccessOwner {
					t.Fatalf("temporary Session %s: owner %q, access %q; want kubectl-user, Owner", ses.Name, ses.Spec.Owner, ses.Spec.Access)
				}
			}
			return live == 1
		})
		interrupt()
		code := exitWithin(t, done, 30*time.Second, "the run did not end after Ctrl-C")
		if code != kubectlplugin.ExitCancelled {
			t.Fatalf("exit %d, want 4 (stderr %q)", code, errOut.String())
		}
	})

	t.Run("a sandbox deleted under the code exits 5", func(t *testing.T) {
		var out, errOut syncBuffer
		done := make(chan int)
		go func() {
			done <- runCtx(ctx, &out, &errOut, "run", "--via", "execution", "--pool", "python", "-c", "import time\nprint('started', flush=True)\ntime.sleep(60)")
		}()
		var pod string
		waitFor(t, func() bool {
			m := created.FindStringSubmatch(errOut.String())
			ex := &sandboxv1alpha1.Execution{}
			if m == nil || admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: m[1]}, ex) != nil || ex.Status.Phase != sandboxv1alpha1.PhaseRunning {
				return false
			}
			pod = ex.Status.PodName
			return true
		})
		time.Sleep(500 * time.Millisecond) // the code has started
		if err := admin.Delete(ctx, &corev1.Pod{ObjectMeta: objectMeta(ns, pod)}); err != nil {
			t.Fatal(err)
		}
		code := exitWithin(t, done, 90*time.Second, "the run did not end after its pod was deleted")
		if code != kubectlplugin.ExitSandboxLost || !strings.Contains(errOut.String(), "SandboxLost") {
			t.Fatalf("exit %d, stderr %q; want 5 and SandboxLost", code, errOut.String())
		}
	})

	t.Run("a Session's sandbox deleted under the code exits 5", func(t *testing.T) {
		if err := admin.Create(ctx, wrappers.Session(ns, "doomed").Obj()); err != nil {
			t.Fatal(err)
		}
		ses := &sandboxv1alpha1.Session{}
		waitFor(t, func() bool {
			return admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "doomed"}, ses) == nil && ses.Status.Phase == sandboxv1alpha1.SessionReady
		})
		var out, errOut syncBuffer
		done := make(chan int)
		go func() {
			done <- runCtx(ctx, &out, &errOut, "run", "--session", "doomed", "-c", "import time\nprint('started', flush=True)\ntime.sleep(60)")
		}()
		waitFor(t, func() bool { return out.String() == "started\n" })
		if err := admin.Delete(ctx, &corev1.Pod{ObjectMeta: objectMeta(ns, ses.Status.PodName)}); err != nil {
			t.Fatal(err)
		}
		code := exitWithin(t, done, 90*time.Second, "the run did not end after its pod was deleted")
		if code != kubectlplugin.ExitSandboxLost {
			t.Fatalf("exit %d, stderr %q; want 5", code, errOut.String())
		}
	})

	t.Run("a Session keeps state between runs, is listed, and closes", func(t *testing.T) {
		if err := admin.Create(ctx, wrappers.Session(ns, "nb").Obj()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool {
			ses := &sandboxv1alpha1.Session{}
			return admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "nb"}, ses) == nil && ses.Status.Phase == sandboxv1alpha1.SessionReady
		})
		ctxFile := filepath.Join(t.TempDir(), "context.json")
		if err := os.WriteFile(ctxFile, []byte(`{"n": 41}`), 0o600); err != nil {
			t.Fatal(err)
		}
		expect(t, plugin("run", "--session", "nb", "--context-file", ctxFile, "--context-format", "json", "-c", "x = context['n']"), 0, "")
		expect(t, plugin("run", "--session", "nb", "-c", "x + 1"), 0, "42\n")
		got := plugin("sessions")
		if got.code != 0 || !regexp.MustCompile(`(?m)^NAME\s+POOL\s+PHASE\s+POD\s+RUNS\s+LAST-ACTIVITY\s+AGE\n(.*\n)*nb\s+python\s+Ready\s+python-\S+\s+\d+\s`).MatchString(got.stdout) {
			t.Fatalf("sessions: exit %d\nstdout:\n%s\nstderr:\n%s", got.code, got.stdout, got.stderr)
		}
		expect(t, plugin("sessions", "close", "nb"), 0, "session.sandbox.warmpool.dev/nb closed\n")
		waitFor(t, func() bool {
			ses := &sandboxv1alpha1.Session{}
			return admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "nb"}, ses) == nil && ses.Status.Phase == sandboxv1alpha1.SessionClosed
		})
		got = plugin("run", "--session", "nb", "-c", "x")
		if got.code == 0 {
			t.Fatalf("a closed Session ran code: %+v", got)
		}
	})

	t.Run("sessions snapshot writes a file, restore puts it into another Session, fork copies one on the server", func(t *testing.T) {
		expect(t, plugin("run", "--pool", "python", "--session", "src", "-c", "x = 41\nimport socket\ns = socket.socket()"), 0, "*")
		file := filepath.Join(t.TempDir(), "src.wpsnap")
		got := plugin("sessions", "snapshot", "src", "-o", file)
		expect(t, got, 0, "*", "not saved", "s (TypeError: cannot pickle 'socket' object)")
		if !strings.HasPrefix(got.stdout, file+": ") || !strings.Contains(got.stdout, "variables") {
			t.Fatalf("snapshot: %q", got.stdout)
		}
		expect(t, plugin("run", "--pool", "python", "--session", "dst", "-c", "x = 0"), 0, "*")
		expect(t, plugin("sessions", "restore", "dst", "-f", file), 0, "*")
		expect(t, plugin("run", "--session", "dst", "-c", "x + 1"), 0, "42\n")
		got = plugin("sessions", "fork", "src", "--name", "src-a", "--name", "src-b")
		expect(t, got, 0, "session.sandbox.warmpool.dev/src-a forked from src\nsession.sandbox.warmpool.dev/src-b forked from src\n")
		expect(t, plugin("run", "--session", "src-a", "-c", "x += 1\nx"), 0, "42\n")
		expect(t, plugin("run", "--session", "src-b", "-c", "x"), 0, "41\n")
		bad := filepath.Join(t.TempDir(), "bad")
		_ = os.WriteFile(bad, []byte("not a snapshot"), 0o600)
		expect(t, plugin("sessions", "restore", "dst", "-f", bad), kubectlplugin.ExitUsage, "", "not a warmpool snapshot")
		for _, n := range []string{"src", "dst", "src-a", "src-b"} {
			expect(t, plugin("sessions", "close", n), 0, "*")
		}
	})

	t.Run("run --session with --pool creates the Session and keeps it; without --pool it says how", func(t *testing.T) {
		expect(t, plugin("run", "--session", "scratch", "-c", "1"), kubectlplugin.ExitOther, "",
			`Session "scratch" not found`, "--pool")
		expect(t, plugin("run", "--pool", "python", "--session", "scratch", "-c", "x = 41\nprint('no newline', end='')\nx"),
			0, "no newline\n41\n", "session.sandbox.warmpool.dev/scratch created")
		got := plugin("run", "--pool", "python", "--session", "scratch", "-c", "x + 1")
		expect(t, got, 0, "42\n")
		if strings.Contains(got.stderr, "created") {
			t.Fatalf("an existing Session is not created again: %q", got.stderr)
		}
		ses := &sandboxv1alpha1.Session{}
		if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "scratch"}, ses); err != nil ||
			ses.Spec.Owner != "kubectl-user" || ses.Spec.Access != sandboxv1alpha1.SessionAccessOwner || ses.Spec.Close {
			t.Fatalf("the Session a run creates is the user's alone and stays open: %+v, %v", ses.Spec, err)
		}
		expect(t, plugin("sessions", "close", "scratch"), 0, "*")
	})

	t.Run("Ctrl-C while the run waits for a sandbox exits 4 and leaves no Session holding one", func(t *testing.T) {
		// A pool whose pods the scheduler cannot place: the run waits.
		pool := wrappers.Pool(ns, "full").Replicas(1).Obj()
		pool.Spec.Template = &sandboxv1alpha1.SandboxPodTemplate{Metadata: sandboxv1alpha1.SandboxPodMetadata{
			Annotations: map[string]string{localkubelet.AnnotationUnschedulable: "0/1 nodes are available: 1 Insufficient cpu."}}}
		if err := admin.Create(ctx, pool); err != nil {
			t.Fatal(err)
		}
		var out, errOut syncBuffer
		cctx, interrupt := context.WithCancel(ctx)
		defer interrupt()
		done := make(chan int)
		go func() { done <- runCtx(cctx, &out, &errOut, "run", "--pool", "full", "-c", "print('ran')") }()
		var waiting string
		waitFor(t, func() bool {
			var list sandboxv1alpha1.SessionList
			if err := admin.List(ctx, &list, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			for _, ses := range list.Items {
				if ses.Spec.PoolRef.Name == "full" {
					waiting = ses.Name
				}
			}
			return waiting != ""
		})
		interrupt()
		code := exitWithin(t, done, 30*time.Second, "the run did not end after Ctrl-C")
		if code != kubectlplugin.ExitCancelled || out.String() != "" || !strings.Contains(errOut.String(), "interrupted") {
			t.Fatalf("exit %d, stdout %q, stderr %q; want 4, nothing printed, and why", code, out.String(), errOut.String())
		}
		waitFor(t, func() bool {
			ses := &sandboxv1alpha1.Session{}
			err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: waiting}, ses)
			return apierrors.IsNotFound(err) || err == nil && (ses.Spec.Close || ses.Status.Phase.IsFinished())
		})

		// The pool says Unschedulable once it has seen its pod's condition:
		// the run can be interrupted before that.
		var got result
		deadline := time.Now().Add(30 * time.Second)
		for got = plugin("top"); !strings.Contains(got.stdout, "Unschedulable") && time.Now().Before(deadline); got = plugin("top") {
			time.Sleep(100 * time.Millisecond)
		}
		if got.code != 0 || !regexp.MustCompile(`(?m)^full\s+1\s+0\s+0\s+\d+\s+\d+\s+-\s+-\s+\S+\s+Unschedulable\s`).MatchString(got.stdout) ||
			!strings.Contains(got.stderr, ns+"/full: Unschedulable: 0 of 1 idle pods ready; pod full-") ||
			!strings.Contains(got.stderr, "Insufficient cpu") {
			t.Fatalf("top must show why the pool has no pods:\n%s%s", got.stdout, got.stderr)
		}
		if err := admin.Delete(ctx, pool); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("top shows the pool, -o wide and json too", func(t *testing.T) {
		var got result
		waitFor(t, func() bool { // the runs before took pods: wait for the pool to be full again
			got = plugin("top")
			return regexp.MustCompile(`(?m)^python\s.*IdleReplicasReady`).MatchString(got.stdout)
		})
		if got.code != 0 || !regexp.MustCompile(`(?m)^NAME\s+REPLICAS\s+IDLE\s+BUSY\s+WARMING\s+WAITING\s+WARM-HIT\s+STARTUP\s+ROLLOUT\s+STATUS\s+AGE\n(.*\n)*python\s+2\s+\d+\s+\d+\s+\d+\s+0\s+\d+\.\d%\s+\d+\.\ds\s+done\s+IdleReplicasReady\s+\S+\n`).MatchString(got.stdout) {
			t.Fatalf("top: exit %d\n%s%s", got.code, got.stdout, got.stderr)
		}
		got = plugin("top", "-o", "wide")
		if got.code != 0 || !regexp.MustCompile(`(?m)^NAME\s+.*\s+STATUS\s+AGE\s+MAX-PODS\s+AGENTS\s+NODES\s+MESSAGE\n(.*\n)*python\s+.*IdleReplicasReady\s+\S+\s+-\s+dev\S*x\d+\s+-\s+\d+ of 2 idle pods ready\n`).MatchString(got.stdout) ||
			// This user may read pools, not pods: the rest of the table, and why NODES is empty.
			!strings.Contains(got.stderr, `NODES unknown: list the pools' pods: pods is forbidden`) {
			t.Fatalf("top -o wide: exit %d\n%s%s", got.code, got.stdout, got.stderr)
		}
		got = plugin("top", "-o", "json")
		var pools sandboxv1alpha1.SandboxPoolList
		if err := json.Unmarshal([]byte(got.stdout), &pools); err != nil || got.code != 0 || pools.Kind != "SandboxPoolList" ||
			len(pools.Items) == 0 || pools.Items[0].Name != "python" || pools.Items[0].Kind != "SandboxPool" ||
			pools.Items[0].APIVersion != "sandbox.warmpool.dev/v1alpha1" {
			t.Fatalf("top -o json: exit %d, %v\n%s", got.code, err, got.stdout)
		}
		got = plugin("sessions", "-o", "yaml")
		if got.code != 0 || !strings.HasPrefix(got.stdout, "apiVersion: sandbox.warmpool.dev/v1alpha1\nitems:\n") {
			t.Fatalf("sessions -o yaml: exit %d\n%s%s", got.code, got.stdout, got.stderr)
		}
		expect(t, plugin("sessions", "-o", "table"), kubectlplugin.ExitUsage, "", "--output is json, yaml or wide")
	})

	t.Run("version prints the plugin's and the cluster's, and fails on a context that does not exist", func(t *testing.T) {
		got := plugin("version")
		expect(t, got, 0, "*")
		if !strings.HasPrefix(got.stdout, "Client Version: ") || !strings.Contains(got.stdout, "Kubernetes Version: v1.") {
			t.Fatalf("version:\n%s", got.stdout)
		}
		got = plugin("version", "--context", "nope")
		expect(t, got, 1, "*", `context "nope" does not exist`)
		if !strings.HasPrefix(got.stdout, "Client Version: ") || strings.Contains(got.stdout, "Kubernetes Version") {
			t.Fatalf("version --context nope: the client's version, and no cluster's:\n%s", got.stdout)
		}
	})

	t.Run("bad input: usage errors exit 2, a missing pool 6, logs of an unfinished Execution say so", func(t *testing.T) {
		expect(t, plugin("run", "--pool", "python"), kubectlplugin.ExitUsage, "", "no code")
		expect(t, plugin("run", "-c", "1"), kubectlplugin.ExitUsage, "", "--pool")
		expect(t, plugin("run", "--pool", "python", "--no-such-flag", "-c", "1"), kubectlplugin.ExitUsage, "", "unknown flag")
		expect(t, plugin("run", "--pool", "nope", "-c", "1"), kubectlplugin.ExitOther, "", `SandboxPool "nope" not found`)
		waiting := wrappers.Execution(ns, "waits").Pool("nope").Code("1").Obj()
		if err := admin.Create(ctx, waiting); err != nil {
			t.Fatal(err)
		}
		expect(t, plugin("logs", "waits"), 1, "", "is Pending")
		expect(t, plugin("logs", "no-such"), 1, "", "not found")
	})
}

// exitWithin is the exit code of a run started in the background, which must
// end within d (what says after what).
func exitWithin(t *testing.T, done <-chan int, d time.Duration, what string) int {
	t.Helper()
	select {
	case code := <-done:
		return code
	case <-time.After(d):
		t.Fatal(what)
		return 0
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func objectMeta(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name}
}
