package chaos

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"time"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// kind of Execution in the mix, with the outcome its code determines.
type kind string

const (
	kindPlain    kind = "plain"    // prints and returns a value computed from its name
	kindRaise    kind = "raise"    // raises ValueError
	kindTimeout  kind = "timeout"  // loops past its 1 s timeout
	kindCancel   kind = "cancel"   // sleeps; the harness cancels it
	kindSelfKill kind = "selfkill" // kills its own interpreter
	kindFresh    kind = "fresh"    // on a FreshInterpreter pool: must never see a predecessor's variable
	kindSession  kind = "session"  // one step of a session: must see its own session's state, only it
	// kindSuspend is a step of a Session that is suspended between its steps
	// (idle 1 s) and resumed by the next one: it must see its own state.
	kindSuspend kind = "suspend"
)

type expectation struct {
	kind    kind
	stdout  string // for Succeeded
	result  string // for Succeeded
	session string
}

// prelude records each start of the code in the run log: a second line for
// one name is a double run. The line also says when, where (the sandbox's
// workspace names its pod) and in which interpreter process, so that a
// double run can be told apart: two pods, or one pod and two interpreters.
func (h *harness) prelude(name string) string {
	return fmt.Sprintf("import os as _os, time as _time\n_fd = _os.open(%q, _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT)\n"+
		"_os.write(_fd, ('%s %%.3f %%s pid=%%d\\n' %% (_time.time(), _os.getcwd(), _os.getpid())).encode())\n_os.close(_fd)\n",
		h.runLog, name)
}

// submit creates n Executions of mixed kinds at a steady pace, and cancels
// the cancel kind a moment after.
func (h *harness) submit(n int) {
	ctx := context.Background()
	weights := []struct {
		k kind
		w int
	}{{kindPlain, 35}, {kindRaise, 8}, {kindTimeout, 5}, {kindCancel, 5}, {kindSelfKill, 5}, {kindFresh, 15}, {kindSession, 27}}
	pick := func() kind {
		x := h.rng.Intn(100)
		for _, w := range weights {
			if x < w.w {
				return w.k
			}
			x -= w.w
		}
		return kindPlain
	}
	session, step := 0, 0
	for i := 0; i < n; i++ {
		k := pick()
		name := fmt.Sprintf("%s-%04d", k, i)
		w := wrappers.Execution(ns, name).Pool("plain")
		exp := expectation{kind: k}
		switch k {
		case kindPlain:
			w.Code(h.prelude(name) + fmt.Sprintf("print(%q)\n%d * %d", name, i, i))
			exp.stdout, exp.result = name+"\n", fmt.Sprint(i*i)
		case kindRaise:
			w.Code(h.prelude(name) + fmt.Sprintf("raise ValueError(%q)", name))
		case kindTimeout:
			w.Code(h.prelude(name) + "while True:\n    pass").Timeout(time.Second)
		case kindCancel:
			w.Code(h.prelude(name) + "import time\ntime.sleep(20)").Timeout(30 * time.Second)
		case kindSelfKill:
			// A segmentation fault: the interpreter is its PID namespace's
			// init, which a signal it sends itself does not end.
			w.Code(h.prelude(name) + "import ctypes\nctypes.string_at(0)")
		case kindFresh:
			w.Pool("fresh").Code(h.prelude(name) + "seen = 'leak' in globals()\nleak = 1\nseen")
			exp.result = "False"
		case kindSession:
			if step == 0 || step == 5 {
				session, step = session+1, 0
			}
			sid := fmt.Sprintf("s%03d", session)
			name = fmt.Sprintf("session-%04d-%s-%d", i, sid, step)
			code := fmt.Sprintf("if %d == 0:\n    owner, n = %q, 0\nassert owner == %q, 'session state of ' + owner\nn += 1\nn", step, sid, sid)
			w = wrappers.Execution(ns, name).Pool("sessions").Session(sid).Code(h.prelude(name) + code)
			exp.result, exp.session = fmt.Sprint(step+1), sid
			step++
		}
		h.mu.Lock()
		h.expected[name] = exp
		h.mu.Unlock()
		ex := w.Obj()
		if err := h.create(ctx, ex); err != nil {
			h.t.Fatalf("create %s: %v", name, err)
		}
		if k == kindCancel {
			go h.cancelLater(name, time.Duration(300+h.rng.Intn(1500))*time.Millisecond)
		}
		time.Sleep(time.Duration(20+h.rng.Intn(60)) * time.Millisecond)
	}
}

// suspendingSession runs a Session of pool "suspending" step by step, each
// created after the one before ended and the Session was idle long enough
// to be suspended: the steps resume it, under the harness's faults. (The
// rng is the fault injector's too: the gaps draw from their own.)
func (h *harness) suspendingSession(i, steps int) {
	ctx := context.Background()
	rng := rand.New(rand.NewSource(int64(i)))
	sid := fmt.Sprintf("z%03d", i)
	for step := range steps {
		name := fmt.Sprintf("suspend-%s-%d", sid, step)
		code := fmt.Sprintf("if %d == 0:\n    owner, n = %q, 0\nassert owner == %q, 'session state of ' + owner\nn += 1\nn", step, sid, sid)
		ex := wrappers.Execution(ns, name).Pool("suspending").Session(sid).Code(h.prelude(name) + code).Obj()
		h.mu.Lock()
		h.expected[name] = expectation{kind: kindSuspend, result: fmt.Sprint(step + 1), session: sid}
		h.mu.Unlock()
		if err := h.create(ctx, ex); err != nil {
			h.t.Errorf("create %s: %v", name, err)
			return
		}
		// Until it ended (a fault may end it, or lose the Session: then the
		// next steps fail SessionLost, which the check accepts only for a
		// pod lost while the Session held it).
		for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			got := &sandboxv1alpha1.Execution{}
			if h.k8s.Get(ctx, keyOf(name), got) == nil && got.Status.Phase.IsFinished() {
				break
			}
		}
		// Idle past the pool's suspendAfter (1 s) and the 10 s a resumed
		// Session keeps its pod: suspended meanwhile.
		time.Sleep(time.Duration(11500+rng.Intn(2000)) * time.Millisecond)
	}
}

// create retries while the API server is down (a fault the harness causes).
func (h *harness) create(ctx context.Context, ex *sandboxv1alpha1.Execution) error {
	var err error
	for i := 0; i < 100; i++ {
		if err = h.k8s.Create(ctx, ex); err == nil || strings.Contains(err.Error(), "already exists") {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return err
}

func (h *harness) cancelLater(name string, after time.Duration) {
	time.Sleep(after)
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		ex := &sandboxv1alpha1.Execution{}
		if err := h.k8s.Get(ctx, keyOf(name), ex); err == nil {
			ex.Spec.Cancel = true
			if err = h.k8s.Update(ctx, ex); err == nil {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}
