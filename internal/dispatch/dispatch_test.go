package dispatch

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

const ns = "ns"

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// recorder collects the wake-ups a dispatcher sends.
type recorder struct {
	execs, sessions []string
	pools           int
}

func newDispatcher(mods ...func(*Options)) (*Dispatcher, *recorder) {
	rec := &recorder{}
	o := Options{
		WakeExecution: func(n types.NamespacedName) { rec.execs = append(rec.execs, n.Name) },
		WakePool:      func(types.NamespacedName) { rec.pools++ },
		WakeSession:   func(n types.NamespacedName) { rec.sessions = append(rec.sessions, n.Name) },
	}
	for _, m := range mods {
		m(&o)
	}
	return New(o), rec
}

func (r *recorder) take() []string {
	out := r.execs
	r.execs = nil
	slices.Sort(out)
	return out
}

// ex is a waiting Execution of pool "python" created at t0+sec.
func ex(name string, sec int) *wrappers.ExecutionWrapper {
	return wrappers.Execution(ns, name).UID("uid-" + name).Created(t0.Add(time.Duration(sec) * time.Second))
}

func pod(name string) *wrappers.PodWrapper { return wrappers.Pod(ns, name, "python") }

var poolKey = types.NamespacedName{Namespace: ns, Name: "python"}

func TestFirstComeFirstServed(t *testing.T) {
	d, rec := newDispatcher()
	for i, name := range []string{"c", "a", "b"} {
		d.UpdateExecution(ex(name, 10-i).Obj()) // b oldest, then a, then c
	}
	if got := d.Demand(poolKey); got != 3 {
		t.Fatalf("demand %d, want 3", got)
	}
	d.UpdatePod(pod("p1").Obj())
	d.UpdatePod(pod("p2").Obj())
	if got := rec.take(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("woke %v, want the two oldest [a b]", got)
	}
	if got := d.Place(ex("b", 8).Obj()).Pod; got != "p1" {
		t.Errorf("b got %q, want p1 (the oldest gets the first pod)", got)
	}
	if pl := d.Place(ex("c", 10).Obj()); pl.Pod != "" || !pl.NeedsFreshPod {
		t.Errorf("c: %+v, want waiting for a fresh pod", pl)
	}
	if got := d.Demand(poolKey); got != 1 {
		t.Errorf("demand %d, want 1", got)
	}
}

// OldestWaiting feeds warmpool_pool_oldest_pending_created_timestamp_seconds:
// the longest-waiting claim, and nothing once every claim has a pod.
func TestOldestWaitingIsTheHeadOfTheQueue(t *testing.T) {
	d, _ := newDispatcher()
	if got := d.OldestWaiting(poolKey); !got.IsZero() {
		t.Fatalf("empty pool: %v, want zero", got)
	}
	d.UpdateExecution(ex("late", 20).Obj())
	d.UpdateExecution(ex("early", 5).Obj())
	d.UpdateSession(ses("nb", 10).Obj())
	if got, want := d.OldestWaiting(poolKey), t0.Add(5*time.Second); !got.Equal(want) {
		t.Fatalf("oldest %v, want %v (early)", got, want)
	}
	d.UpdatePod(pod("p1").Obj())
	if got, want := d.OldestWaiting(poolKey), t0.Add(10*time.Second); !got.Equal(want) {
		t.Fatalf("after early got a pod: %v, want %v (the Session)", got, want)
	}
	d.UpdatePod(pod("p2").Obj())
	d.UpdatePod(pod("p3").Obj())
	if got := d.OldestWaiting(poolKey); !got.IsZero() {
		t.Fatalf("all served: %v, want zero", got)
	}
}

// Regression (issue 10, item 4): with session followers older than a plain
// Execution, a freed pod used to wake the oldest waiting Executions, the
// followers, which cannot take it, and the plain Execution waited for an
// unrelated event.
func TestFreedPodGoesToTheHeadNotToSessionFollowers(t *testing.T) {
	d, rec := newDispatcher()
	first := ex("s-1", 0).Session("s").Obj()
	d.UpdatePod(pod("sp").ClaimedBy(first).Obj())
	d.UpdateExecution(ex("s-1", 0).Session("s").RunningOn("sp").Obj())
	for i := 2; i <= 4; i++ {
		d.UpdateExecution(ex(fmt.Sprintf("s-%d", i), i).Session("s").Obj())
	}
	d.UpdateExecution(ex("plain", 9).Obj())
	rec.take()
	d.UpdatePod(pod("p1").Obj())
	if got := rec.take(); !slices.Equal(got, []string{"plain"}) {
		t.Fatalf("woke %v, want [plain]", got)
	}
	if got := d.Place(ex("plain", 9).Obj()).Pod; got != "p1" {
		t.Fatalf("plain got %q, want p1", got)
	}
	if pl := d.Place(ex("s-2", 2).Session("s").Obj()); !pl.SessionBusy || pl.Pod != "" || pl.SessionPod != "sp" {
		t.Errorf("s-2: %+v, want waiting for its busy session pod sp", pl)
	}
}

// ses is a Session of pool "python" created at t0+sec.
func ses(name string, sec int) *wrappers.SessionWrapper {
	return wrappers.Session(ns, name).UID("uid-" + name).Created(t0.Add(time.Duration(sec) * time.Second))
}

func TestSessionRunsOneAtATimeInOrderOnItsPod(t *testing.T) {
	d, rec := newDispatcher()
	s1 := ex("s-1", 0).Session("s").Obj()
	d.UpdateExecution(s1)
	d.UpdateExecution(ex("s-2", 1).Session("s").Obj())
	d.UpdateExecution(ex("s-3", 2).Session("s").Obj())
	if got := d.Demand(poolKey); got != 0 {
		t.Fatalf("demand %d, want 0: Executions of a session never take a fresh pod themselves", got)
	}
	d.UpdateSession(ses("s", 3).Obj())
	if got := d.Demand(poolKey); got != 1 {
		t.Fatalf("demand %d, want 1: the Session needs one pod", got)
	}
	rec.take()
	d.UpdatePod(pod("p1").Obj())
	d.UpdatePod(pod("p2").Obj())
	if got := rec.sessions; !slices.Equal(got, []string{"s"}) {
		t.Fatalf("woke sessions %v, want [s]", got)
	}
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("woke executions %v before the Session holds its pod", got)
	}
	if pl := d.PlaceSession(ses("s", 3).Obj()); pl.Pod != "p1" {
		t.Fatalf("session s: %+v, want p1", pl)
	}
	// The Session's claim of p1 is seen before its Ready status: nothing of
	// the session runs until the Session has said it holds the pod.
	d.UpdatePod(pod("p1").RV("2").Session("s").Obj())
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("woke %v before the Session was Ready", got)
	}
	d.UpdateSession(ses("s", 3).ReadyOn("p1").Obj())
	if got := rec.take(); !slices.Equal(got, []string{"s-1"}) {
		t.Fatalf("woke %v, want [s-1]", got)
	}
	d.UpdatePod(pod("p1").RV("3").ClaimedBy(s1).Obj())
	d.UpdateExecution(ex("s-1", 0).Session("s").RunningOn("p1").Obj())
	if pl := d.Place(ex("s-2", 1).Session("s").Obj()); pl.Pod != "" || !pl.SessionBusy {
		t.Fatalf("s-2 while s-1 runs: %+v", pl)
	}
	other := ex("other", 5).Obj()
	d.UpdateExecution(other)
	if got := d.Place(other).Pod; got != "p2" {
		t.Fatalf("other got %q, want p2", got)
	}
	rec.take()
	// s-1 ends; its pod is released to the session after its status: s-2 next, not s-3.
	d.UpdateExecution(ex("s-1", 0).Session("s").RunningOn("p1").Finished(sandboxv1alpha1.PhaseSucceeded).Obj())
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("woke %v before the pod was released", got)
	}
	d.UpdatePod(pod("p1").RV("4").Session("s").Obj())
	if got := rec.take(); !slices.Equal(got, []string{"s-2"}) {
		t.Fatalf("woke %v, want [s-2]", got)
	}
	if got := d.Place(ex("s-2", 1).Session("s").Obj()).Pod; got != "p1" {
		t.Fatalf("s-2 got %q, want the session pod p1", got)
	}
}

func TestSessionThatLostItsPodTakesNoOther(t *testing.T) {
	d, rec := newDispatcher()
	s1 := ex("s-1", 0).Session("s").Obj()
	d.UpdatePod(pod("sp").ClaimedBy(s1).Obj())
	d.UpdateSession(ses("s", 0).ReadyOn("sp").Obj())
	d.UpdateExecution(ex("s-1", 0).Session("s").RunningOn("sp").Obj())
	d.UpdateExecution(ex("s-2", 1).Session("s").Obj())
	d.UpdatePod(pod("fresh").Obj())
	rec.take()
	// The session pod is deleted (lost): s-2 must not get the fresh pod (the
	// Session's status says what became of it).
	d.DeletePod(pod("sp").Obj())
	d.UpdateExecution(ex("s-1", 0).Session("s").RunningOn("sp").Finished(sandboxv1alpha1.PhaseFailed).Obj())
	if pl := d.Place(ex("s-2", 1).Session("s").Obj()); !pl.NoSessionPod || pl.Pod != "" || pl.NeedsFreshPod {
		t.Fatalf("s-2: %+v, want waiting, with no session pod", pl)
	}
	if got := d.Demand(poolKey); got != 0 {
		t.Fatalf("demand %d, want 0", got)
	}
}

// A manager that stopped between a Session's claim and its Ready status left
// a pod labelled with the Session's name: the Session adopts it, and gives
// back a fresh pod chosen before the labelled one was seen.
func TestSessionAdoptsItsLabelledPod(t *testing.T) {
	d, rec := newDispatcher()
	s := ses("s", 0).Obj()
	d.UpdateSession(s)
	d.UpdatePod(pod("fresh").Obj())
	if pl := d.PlaceSession(s); pl.Pod != "fresh" {
		t.Fatalf("s: %+v, want the fresh pod", pl)
	}
	d.UpdatePod(pod("sp").Session("s").Obj())
	d.ClaimFailed("uid-s", "fresh", "")
	if pl := d.PlaceSession(s); pl.Pod != "sp" || pl.NeedsFreshPod {
		t.Fatalf("s after its pod was seen: %+v, want its own pod", pl)
	}
	other := ex("other", 5).Obj()
	d.UpdateExecution(other)
	if got := d.Place(other).Pod; got != "fresh" {
		t.Fatalf("other got %q, want the fresh pod given back", got)
	}
	rec.take()
}

// Regression (found by the chaos suite): a new leader learned of a pod
// labelled with a Session's name and of the Session's Executions before it
// learned of the Session, which was still adopting that pod; the head
// Execution got the pod, could not use it (its Session was not Ready), and
// the Session waited forever for a pod held by nobody.
func TestSessionExecutionsWaitUntilTheSessionIsReady(t *testing.T) {
	d, rec := newDispatcher()
	d.UpdatePod(pod("sp").Session("s").Obj())
	d.UpdateExecution(ex("s-1", 1).Session("s").Obj())
	if pl := d.Place(ex("s-1", 1).Session("s").Obj()); pl.Pod != "" {
		t.Fatalf("s-1 before its Session is known: %+v, want no pod", pl)
	}
	s := ses("s", 0).Obj()
	d.UpdateSession(s)
	if pl := d.PlaceSession(s); pl.Pod != "sp" {
		t.Fatalf("session s: %+v, want to adopt sp", pl)
	}
	rec.take()
	d.UpdateSession(ses("s", 0).ReadyOn("sp").Obj())
	if got := rec.take(); !slices.Equal(got, []string{"s-1"}) {
		t.Fatalf("woke %v once the Session was Ready, want [s-1]", got)
	}
	if pl := d.Place(ex("s-1", 1).Session("s").Obj()); pl.Pod != "sp" {
		t.Fatalf("s-1 after its Session is Ready: %+v, want sp", pl)
	}
	// A deleted Session's Executions get nothing more.
	d.UpdateExecution(ex("s-1", 1).Session("s").RunningOn("sp").Finished(sandboxv1alpha1.PhaseSucceeded).Obj())
	d.DeleteSession(ses("s", 0).ReadyOn("sp").Obj())
	d.UpdateExecution(ex("s-2", 2).Session("s").Obj())
	d.UpdatePod(pod("sp").RV("5").Session("s").Obj())
	if pl := d.Place(ex("s-2", 2).Session("s").Obj()); pl.Pod != "" {
		t.Fatalf("s-2 after its Session was deleted: %+v, want no pod", pl)
	}
}

// A Session deleted and created again under its name is another Session: it
// must not adopt the first one's pod (its variables and files), and its
// Executions must not run there.
func TestSessionOfTheSameNameDoesNotAdoptAnEarlierSessionsPod(t *testing.T) {
	d, _ := newDispatcher()
	old := wrappers.Session(ns, "s").UID("uid-old").Obj()
	d.UpdatePod(pod("old-pod").HeldBy(old).Obj())
	d.UpdatePod(pod("fresh").Obj())
	s := ses("s", 5).Obj()
	d.UpdateSession(s)
	if pl := d.PlaceSession(s); pl.Pod != "fresh" {
		t.Fatalf("new Session s: %+v, want the fresh pod, not the earlier Session's", pl)
	}
	d.UpdatePod(pod("fresh").RV("2").HeldBy(s).Obj())
	d.UpdateSession(ses("s", 5).ReadyOn("fresh").Obj())
	d.UpdateExecution(ex("s-1", 6).Session("s").Obj())
	// The old pod's events keep coming until the pool deletes it.
	d.UpdatePod(pod("old-pod").RV("3").HeldBy(old).Obj())
	if pl := d.Place(ex("s-1", 6).Session("s").Obj()); pl.Pod != "fresh" {
		t.Fatalf("s-1: %+v, want the new Session's pod", pl)
	}
}

// Regression (found by the chaos suite): a lease retried while the pod
// informer lagged left a second pod labelled with the Session, which went
// Ready on the other one. The stray pod's later events made it the session's
// pod: the session's first Execution ran there, on an interpreter without the
// session's state (SessionLost), and the next ones ran on the Session's real
// pod without what the first would have set.
func TestSessionRunsOnlyOnThePodItsStatusNames(t *testing.T) {
	d, _ := newDispatcher()
	s := ses("s", 0).Obj()
	d.UpdatePod(pod("leased").HeldBy(s).Obj())
	// The stray pod's events keep coming until the pool deletes it; one came last.
	d.UpdatePod(pod("stray").HeldBy(s).Obj())
	d.UpdateSession(ses("s", 0).ReadyOn("leased").Obj())
	d.UpdateExecution(ex("s-1", 1).Session("s").Obj())
	d.UpdatePod(pod("stray").RV("2").HeldBy(s).Obj())
	if pl := d.Place(ex("s-1", 1).Session("s").Obj()); pl.Pod != "leased" {
		t.Fatalf("s-1: %+v, want the pod the Session's status names", pl)
	}
	// A new leader hears of the Session before its pod: nothing runs until the named pod is seen.
	d2, _ := newDispatcher()
	d2.UpdateSession(ses("s", 0).ReadyOn("leased").Obj())
	d2.UpdateExecution(ex("s-1", 1).Session("s").Obj())
	d2.UpdatePod(pod("stray").HeldBy(s).Obj())
	if pl := d2.Place(ex("s-1", 1).Session("s").Obj()); pl.Pod != "" {
		t.Fatalf("s-1 before the named pod is seen: %+v, want it to wait", pl)
	}
	d2.UpdatePod(pod("leased").HeldBy(s).Obj())
	if pl := d2.Place(ex("s-1", 1).Session("s").Obj()); pl.Pod != "leased" {
		t.Fatalf("s-1 after the named pod is seen: %+v, want it", pl)
	}
}

func TestFailedClaimKeepsItsPlaceAndSkipsThePodUntilItChanges(t *testing.T) {
	d, rec := newDispatcher()
	d.UpdateExecution(ex("a", 0).Obj())
	d.UpdateExecution(ex("b", 1).Obj())
	d.UpdatePod(pod("p1").RV("5").Obj())
	if got := d.Place(ex("a", 0).Obj()).Pod; got != "p1" {
		t.Fatalf("a got %q", got)
	}
	rec.take()
	d.ClaimFailed("uid-a", "p1", "5")
	if pl := d.Place(ex("a", 0).Obj()); pl.Pod != "" || !pl.NeedsFreshPod {
		t.Fatalf("a after a failed claim: %+v", pl)
	}
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("woke %v: the pod that failed is not offered again before it changes", got)
	}
	d.UpdatePod(pod("p1").RV("6").Obj())
	if got := rec.take(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("woke %v, want [a]: it kept its place ahead of b", got)
	}
}

func TestPodTakenByAnotherSendsTheChosenOneBack(t *testing.T) {
	d, rec := newDispatcher()
	a := ex("a", 0).Obj()
	d.UpdateExecution(a)
	d.UpdatePod(pod("p1").Obj())
	rec.take()
	// Another manager (or a stale decision) claimed p1 for someone else.
	d.UpdatePod(pod("p1").RV("2").ClaimedBy(ex("intruder", 0).Obj()).Obj())
	d.UpdatePod(pod("p2").Obj())
	if got := rec.take(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("woke %v, want [a]", got)
	}
	if got := d.Place(a).Pod; got != "p2" {
		t.Fatalf("a got %q, want p2", got)
	}
	// Its pod is deleted before the claim: back in the queue, then the next pod.
	d.DeletePod(pod("p2").Obj())
	if pl := d.Place(a); pl.Pod != "" {
		t.Fatalf("a still holds deleted p2: %+v", pl)
	}
	d.UpdatePod(pod("p3").Obj())
	if got := d.Place(a).Pod; got != "p3" {
		t.Fatalf("a got %q, want p3", got)
	}
}

// A Running status stored before its claim (an Execution from before the
// lead) holds the pod it names even when the pod's own event comes after it,
// as a restarted manager's informers deliver them: the pod is not handed to
// another Execution, and its pool counts it as taken, not as a surplus to
// delete. Taken back, the status lets the pod go.
func TestARunningStatusHoldsItsPodWhateverTheOrderOfEvents(t *testing.T) {
	d, rec := newDispatcher()
	a := ex("a", 0).Obj()
	d.UpdateExecution(ex("a", 0).RunningOn("p1").Obj())
	d.UpdatePod(pod("p1").Obj()) // idle, as far as its labels say
	d.UpdateExecution(ex("b", 1).Obj())
	if pl := d.Place(ex("b", 1).Obj()); pl.Pod != "" {
		t.Fatalf("b got %q, the pod a's Running status names", pl.Pod)
	}
	if !d.Promised(poolKey)["p1"] {
		t.Fatalf("promised %v, want p1 counted as taken", d.Promised(poolKey))
	}
	d.UpdatePod(pod("p1").RV("2").Obj()) // another event of the pod, its claim still not seen
	if pl := d.Place(ex("b", 1).Obj()); pl.Pod != "" {
		t.Fatalf("b got %q after the pod's next event", pl.Pod)
	}
	rec.take()
	d.UpdateExecution(a) // Pending again: the claim did not commit
	if d.Promised(poolKey)["p1"] {
		t.Fatal("p1 still counted as taken by a run that went back to the queue")
	}
	d.UpdatePod(pod("p1").RV("3").Obj())
	if got := d.Place(a).Pod; got != "p1" {
		t.Fatalf("a got %q, want p1 back, first in the queue", got)
	}
}

// A Running status written with a claim that did not commit is taken back:
// the Execution waits again, in its place, and gets the next free pod.
func TestRunningTakenBackWaitsAgain(t *testing.T) {
	d, rec := newDispatcher()
	a := ex("a", 0).Obj()
	d.UpdateExecution(a)
	d.UpdatePod(pod("p1").Obj())
	d.UpdateExecution(ex("a", 0).RunningOn("p1").Obj())
	d.UpdateExecution(ex("b", 1).Obj())
	rec.take()
	d.UpdateExecution(a) // Pending again: p1 was claimed by another
	d.UpdatePod(pod("p2").Obj())
	if got := rec.take(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("woke %v, want [a] ahead of b", got)
	}
	if got := d.Place(a).Pod; got != "p2" {
		t.Fatalf("a got %q, want p2", got)
	}
}

func TestDeletedExecutionGivesItsPodToTheNext(t *testing.T) {
	d, rec := newDispatcher()
	d.UpdateExecution(ex("a", 0).Obj())
	d.UpdateExecution(ex("b", 1).Obj())
	d.UpdatePod(pod("p1").Obj())
	rec.take()
	d.DeleteExecution("uid-a")
	if got := rec.take(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("woke %v, want [b]", got)
	}
	// A cancelled one leaves the queue too.
	d.UpdateExecution(ex("c", 2).Obj())
	d.UpdateExecution(ex("c", 2).Cancel().Obj())
	if got := d.Demand(poolKey); got != 0 {
		t.Fatalf("demand %d, want 0", got)
	}
}

func TestClaimSeenBeforeTheStatusEndsTheWait(t *testing.T) {
	d, _ := newDispatcher()
	a := ex("a", 0).Obj()
	d.UpdateExecution(a)
	d.UpdatePod(pod("p1").Obj())
	d.UpdatePod(pod("p1").RV("2").ClaimedBy(a).Obj())
	if pl := d.Place(a); pl.Pod != "" || pl.NeedsFreshPod {
		t.Fatalf("a: %+v, want nothing to wait for", pl)
	}
	if d.Waiting(poolKey) != 0 || d.Demand(poolKey) != 0 {
		t.Fatalf("waiting %d demand %d", d.Waiting(poolKey), d.Demand(poolKey))
	}
}

func TestAForgedClaimOnAPodNotThePoolsLeavesTheExecutionWaiting(t *testing.T) {
	d, _ := newDispatcher(func(o *Options) {
		o.Usable = func(_ *sandboxv1alpha1.SandboxPool, p *corev1.Pod) bool { return p.Name != "lookalike" }
	})
	d.UpdatePool(wrappers.Pool(ns, "python").Obj())
	a := ex("a", 0).Obj()
	d.UpdateExecution(a)
	d.UpdatePod(pod("lookalike").ClaimedBy(a).Obj())
	d.UpdatePod(pod("p1").Obj())
	if pl := d.Place(a); pl.Pod != "p1" {
		t.Fatalf("a: %+v, want the pool's pod p1 (the claim on the look-alike is not a claim)", pl)
	}
}

func TestCurrentTemplateFirstAndUnusablePodsNever(t *testing.T) {
	d, _ := newDispatcher(func(o *Options) {
		o.Usable = func(_ *sandboxv1alpha1.SandboxPool, p *corev1.Pod) bool { return p.Name != "bad" }
	})
	pool := wrappers.Pool(ns, "python").Obj()
	d.UpdatePool(pool)
	d.UpdatePod(pod("a-old").TemplateHash("old").Obj())
	d.UpdatePod(pod("bad").Obj())
	d.UpdatePod(pod("z-new").TemplateHash(sandboxpod.TemplateHash(pool)).Obj())
	e1, e2, e3 := ex("e1", 0).Obj(), ex("e2", 1).Obj(), ex("e3", 2).Obj()
	for _, e := range []*sandboxv1alpha1.Execution{e1, e2, e3} {
		d.UpdateExecution(e)
	}
	if got := d.Place(e1).Pod; got != "z-new" {
		t.Errorf("e1 got %q, want the current-template pod", got)
	}
	if got := d.Place(e2).Pod; got != "a-old" {
		t.Errorf("e2 got %q, want the stale pod", got)
	}
	if got := d.Place(e3).Pod; got != "" {
		t.Errorf("e3 got %q, want none (the pod whose key is gone is never chosen)", got)
	}
}

func TestDemandChangesWakeThePool(t *testing.T) {
	d, rec := newDispatcher()
	d.UpdateExecution(ex("a", 0).Obj())
	d.UpdateExecution(ex("b", 1).Obj())
	if rec.pools != 2 {
		t.Fatalf("pool woken %d times, want 2", rec.pools)
	}
	d.UpdatePod(pod("p1").NotReady().Obj())
	if rec.pools != 2 {
		t.Fatalf("pool woken %d times by a pod that changed nothing", rec.pools)
	}
	d.UpdatePod(pod("p1").RV("2").Obj())
	if rec.pools != 3 || d.Demand(poolKey) != 1 {
		t.Fatalf("pool woken %d times, demand %d", rec.pools, d.Demand(poolKey))
	}
}

// BenchmarkDispatch measures one pod freeing up and its Execution leaving the
// queue, with n Executions waiting: the cost does not grow with n (heap).
func BenchmarkDispatch(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("waiting=%d", n), func(b *testing.B) {
			d := New(Options{})
			for i := 0; i < n+b.N; i++ {
				d.UpdateExecution(ex(fmt.Sprintf("e-%07d", i), i).Obj())
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				name := fmt.Sprintf("e-%07d", i)
				d.UpdatePod(pod("p").RV(fmt.Sprint(i)).Obj())
				e := ex(name, i).Obj()
				d.UpdatePod(pod("p").RV(fmt.Sprint(i) + "c").ClaimedBy(e).Obj())
				d.UpdateExecution(ex(name, i).RunningOn("p").Finished(sandboxv1alpha1.PhaseSucceeded).Obj())
				d.DeletePod(pod("p").Obj())
			}
		})
	}
}

// The autoscaler hears of each claim of a fresh pod once, at its creation
// time: Executions outside sessions and Sessions, not a session's
// Executions, not a second look at the same one, not one already running.
func TestOnClaimCountsEachClaimOfAPodOnce(t *testing.T) {
	var claims []time.Time
	d, _ := newDispatcher(func(o *Options) {
		o.OnClaim = func(pool types.NamespacedName, created time.Time) {
			if pool != poolKey {
				t.Errorf("claim of pool %v", pool)
			}
			claims = append(claims, created)
		}
	})
	d.UpdateExecution(ex("a", 1).Obj())
	d.UpdateExecution(ex("a", 1).Obj()) // seen again
	d.UpdateExecution(ex("s-1", 2).Session("s").Obj())
	d.UpdateSession(ses("s", 3).Obj())
	d.UpdateSession(ses("s", 3).Obj())
	d.UpdateExecution(ex("r", 4).RunningOn("p9").Obj()) // already on a pod (a restart)
	want := []time.Time{t0.Add(time.Second), t0.Add(3 * time.Second)}
	if !slices.Equal(claims, want) {
		t.Fatalf("claims at %v, want %v", claims, want)
	}
}

// A claim is served warm when its pod was Ready before the claim was made,
// cold when it waited for a pod to start; each is told once.
func TestOnClaimedTellsWarmFromCold(t *testing.T) {
	var outcomes []bool
	d, _ := newDispatcher(func(o *Options) {
		o.OnClaimed = func(_ types.NamespacedName, c Claimed) { outcomes = append(outcomes, c.Warm) }
	})
	d.UpdatePod(pod("p1").ReadySince(t0).Obj())
	a := ex("a", 1).Obj()
	d.UpdateExecution(a) // p1 was Ready at t0: warm
	d.UpdateExecution(ex("a", 1).RunningOn("p1").Obj())
	d.UpdateExecution(ex("a", 1).RunningOn("p1").Obj())
	d.UpdateExecution(ex("b", 2).Obj()) // no idle pod: p2 starts for it
	d.UpdatePod(pod("p2").ReadySince(t0.Add(5 * time.Second)).Obj())
	d.UpdateExecution(ex("b", 2).RunningOn("p2").Obj())
	d.UpdateSession(ses("s", 3).Obj()) // p3 became Ready before the Session: warm
	d.UpdatePod(pod("p3").ReadySince(t0.Add(2 * time.Second)).Obj())
	d.UpdateSession(ses("s", 3).ReadyOn("p3").Obj())
	// Within one second the API server's times cannot tell: the order in
	// which the dispatcher saw the claim and the pod's readiness does.
	d.UpdateExecution(ex("c", 4).Obj()) // p4 becomes Ready in the claim's second, after it: cold
	d.UpdatePod(pod("p4").ReadySince(t0.Add(4 * time.Second)).Obj())
	d.UpdateExecution(ex("c", 4).RunningOn("p4").Obj())
	d.UpdatePod(pod("p5").ReadySince(t0.Add(5 * time.Second)).Obj())
	d.UpdateExecution(ex("e", 5).Obj()) // p5 was Ready in the claim's second, before it: warm
	d.UpdateExecution(ex("e", 5).RunningOn("p5").Obj())
	if want := []bool{true, false, true, false, true}; !slices.Equal(outcomes, want) {
		t.Fatalf("outcomes %v, want %v", outcomes, want)
	}
}

// A pod chosen for an Execution is taken, for the pool's count of idle pods,
// from the choice until the claim is on it; a claim that fails frees it.
func TestPromisedFromChoiceUntilClaim(t *testing.T) {
	d, _ := newDispatcher()
	a, b := ex("a", 0).Obj(), ex("b", 1).Obj()
	d.UpdateExecution(a)
	d.UpdateExecution(b)
	d.UpdatePod(pod("p1").RV("5").Obj())
	d.UpdatePod(pod("p2").RV("5").Obj())
	d.UpdatePod(pod("p3").RV("5").Obj())
	if got := d.Promised(poolKey); len(got) != 2 || !got["p1"] || !got["p2"] {
		t.Fatalf("promised %v, want p1 and p2 (chosen for a and b), not the free p3", got)
	}
	d.UpdatePod(pod("p1").RV("6").ClaimedBy(a).Obj())
	d.ClaimFailed("uid-b", "p2", "5")
	if got := d.Promised(poolKey); len(got) != 1 || !got["p3"] {
		t.Fatalf("promised %v after a's claim landed and b's failed on p2, want p3 (b's next choice)", got)
	}
	d.UpdatePod(pod("p3").RV("6").ClaimedBy(b).Obj())
	if got := d.Promised(poolKey); len(got) != 0 {
		t.Fatalf("promised %v after both claims landed, want none", got)
	}
	if got := d.Promised(types.NamespacedName{Namespace: ns, Name: "other"}); got != nil {
		t.Fatalf("promised %v of an unknown pool", got)
	}
}

// The lease's claim is written alongside the Session's Ready status: the
// status can arrive first, or alone (the manager stopped before the claim
// landed, and a new leader hears of the Session and an idle pod). The pod the
// status names is the Session's: no other claim gets it, and the pool counts
// it as taken, until the Session lets it go.
func TestAPodAReadySessionNamesIsNotIdleBeforeItsClaimLands(t *testing.T) {
	d, _ := newDispatcher()
	d.UpdatePod(pod("leased").Obj())
	d.UpdatePod(pod("other").Obj())
	d.UpdateSession(ses("s", 0).ReadyOn("leased").Obj())
	if !d.Promised(poolKey)["leased"] {
		t.Fatalf("promised %v, want the named pod counted as taken", d.Promised(poolKey))
	}
	for i := range 2 {
		e := ex(fmt.Sprintf("e-%d", i), i+1).Obj()
		d.UpdateExecution(e)
		// Its own event, still idle, must not free it either.
		d.UpdatePod(pod("leased").RV(fmt.Sprint(i + 2)).Obj())
		if got := d.Place(e).Pod; got == "leased" {
			t.Fatalf("e-%d got the pod a Ready Session's status names", i)
		}
	}
	// e-0 took the other pod; e-1 waits, and gets the pod once the Session lets it go.
	d.UpdateSession(ses("s", 0).ReadyOn("leased").Closed().Obj())
	if got := d.Place(ex("e-1", 2).Obj()).Pod; got != "leased" {
		t.Fatalf("after the Session ended: got %q, want the pod it no longer names", got)
	}
}
