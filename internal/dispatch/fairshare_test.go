package dispatch

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// A shared pool "python" in namespace "platform", used by tenants "big" and
// "small" (admitted) and "outsider" (not).
const platform = "platform"

var sharedKey = types.NamespacedName{Namespace: platform, Name: "python"}

func sharedDispatcher(t *testing.T, limits sandboxv1alpha1.TenantLimits, weights map[string]int32, mods ...func(*Options)) (*Dispatcher, *[]types.NamespacedName) {
	t.Helper()
	var woke []types.NamespacedName
	o := Options{
		WakeExecution: func(n types.NamespacedName) { woke = append(woke, n) },
		WakePool:      func(types.NamespacedName) {},
		WakeSession:   func(n types.NamespacedName) { woke = append(woke, n) },
		Admitted:      func(_ *sandboxv1alpha1.SandboxPool, ns string) bool { return ns == "big" || ns == "small" },
	}
	for _, m := range mods {
		m(&o)
	}
	d := New(o)
	pool := wrappers.Pool(platform, "python").Shared(map[string]string{"tenant": "yes"}, limits)
	for ns, w := range weights {
		pool.TenantWeight(ns, w)
	}
	obj := pool.Obj()
	obj.UID, obj.Generation = "pool-uid", 1
	d.UpdatePool(obj)
	return d, &woke
}

func tenantEx(ns, name string, sec int) *sandboxv1alpha1.Execution {
	return wrappers.Execution(ns, name).SharedPool(platform, "python").UID(ns + "-" + name).
		Created(t0.Add(time.Duration(sec) * time.Millisecond)).Obj()
}

func sharedPod(name string) *wrappers.PodWrapper { return wrappers.Pod(platform, name, "python") }

// placed returns which of the tenants' Executions got a pod.
func placed(d *Dispatcher, exs []*sandboxv1alpha1.Execution) []string {
	var out []string
	for _, e := range exs {
		if d.Place(e).Pod != "" {
			out = append(out, e.Namespace+"/"+e.Name)
		}
	}
	return out
}

func TestSmallTenantIsNotQueuedBehindABurst(t *testing.T) {
	d, _ := sharedDispatcher(t, sandboxv1alpha1.TenantLimits{}, nil)
	var exs []*sandboxv1alpha1.Execution
	for i := range 1000 {
		e := tenantEx("big", fmt.Sprintf("b%04d", i), i)
		exs = append(exs, e)
		d.UpdateExecution(e)
	}
	small := tenantEx("small", "s", 5000) // arrives after the whole burst
	exs = append(exs, small)
	d.UpdateExecution(small)

	// The burst holds two pods already.
	d.UpdatePod(sharedPod("p1").Obj())
	d.UpdatePod(sharedPod("p2").Obj())
	if got := placed(d, exs); !slices.Equal(got, []string{"big/b0000", "small/s"}) {
		t.Fatalf("placed %v, want the burst's first and the small tenant's run (it holds no pod, the burst one)", got)
	}
	if got := d.Demand(sharedKey); got != 999 {
		t.Errorf("demand %d, want the 999 still waiting: the pool grows for every tenant", got)
	}
}

func TestWeightsShareOutPods(t *testing.T) {
	d, _ := sharedDispatcher(t, sandboxv1alpha1.TenantLimits{}, map[string]int32{"big": 3})
	var exs []*sandboxv1alpha1.Execution
	for i := range 20 {
		for _, ns := range []string{"big", "small"} {
			e := tenantEx(ns, fmt.Sprintf("e%02d", i), i)
			exs = append(exs, e)
			d.UpdateExecution(e)
		}
	}
	for i := range 8 {
		d.UpdatePod(sharedPod(fmt.Sprintf("p%d", i)).Obj())
	}
	n := map[string]int{}
	for _, e := range exs {
		if d.Place(e).Pod != "" {
			n[e.Namespace]++
		}
	}
	if n["big"] != 6 || n["small"] != 2 {
		t.Errorf("pods %v, want big 6 and small 2 (weight 3 against 1)", n)
	}
}

func TestTenantLimitsHoldItsWorkNotOthers(t *testing.T) {
	d, _ := sharedDispatcher(t, sandboxv1alpha1.TenantLimits{MaxPods: ptr.To[int32](2), MaxWaiting: ptr.To[int32](3)}, nil)
	var exs []*sandboxv1alpha1.Execution
	for i := range 5 {
		e := tenantEx("big", fmt.Sprintf("b%d", i), i)
		exs = append(exs, e)
		d.UpdateExecution(e)
	}
	small := tenantEx("small", "s", 100)
	exs = append(exs, small)
	d.UpdateExecution(small)
	for i := range 4 {
		d.UpdatePod(sharedPod(fmt.Sprintf("p%d", i)).Obj())
	}
	if got := placed(d, exs); !slices.Equal(got, []string{"big/b0", "big/b1", "small/s"}) {
		t.Fatalf("placed %v, want two of big (its maxPods) and small's", got)
	}
	if pl := d.Place(exs[2]); !pl.TenantLimit || pl.OverWaitingLimit {
		t.Errorf("b2: %+v, want waiting on its namespace's limit, within maxWaiting", pl)
	}
	// b2, b3 and b4 wait: three, the limit. A sixth is one too many.
	extra := tenantEx("big", "b5", 200)
	d.UpdateExecution(extra)
	if pl := d.Place(extra); !pl.OverWaitingLimit {
		t.Errorf("b5: %+v, want over maxWaiting (3 of its namespace wait before it)", pl)
	}
	if pl := d.Place(exs[4]); pl.OverWaitingLimit {
		t.Errorf("b4: %+v, want within maxWaiting", pl)
	}
	if got := d.Demand(sharedKey); got != 0 {
		t.Errorf("demand %d, want 0: big may not hold more pods, so more pods would idle", got)
	}
	if got := d.Tenants(sharedKey); len(got) != 2 || got[0] != (sandboxv1alpha1.TenantUsage{Namespace: "big", Pods: 2, Waiting: 4}) ||
		got[1] != (sandboxv1alpha1.TenantUsage{Namespace: "small", Pods: 1}) {
		t.Errorf("tenants %+v, want big holding 2 with 4 waiting, then small holding 1", got)
	}
}

func TestNamespaceNotAdmittedGetsNoPod(t *testing.T) {
	d, _ := sharedDispatcher(t, sandboxv1alpha1.TenantLimits{}, nil)
	out := tenantEx("outsider", "o", 0)
	d.UpdateExecution(out)
	d.UpdatePod(sharedPod("p1").Obj())
	if pl := d.Place(out); pl.Pod != "" {
		t.Fatalf("outsider got %q: its namespace is not admitted", pl.Pod)
	}
	if got := d.Demand(sharedKey); got != 0 {
		t.Errorf("demand %d, want 0: the pool does not grow for a namespace it does not admit", got)
	}
	in := tenantEx("small", "s", 1)
	d.UpdateExecution(in)
	if pl := d.Place(in); pl.Pod != "p1" {
		t.Errorf("small: %+v, want p1 (control: the pod was free)", pl)
	}
}

func TestReusedPodServesOnlyItsTenant(t *testing.T) {
	d, _ := sharedDispatcher(t, sandboxv1alpha1.TenantLimits{}, nil)
	d.UpdatePod(sharedPod("used-by-big").Tenant("big").Obj())
	s := tenantEx("small", "s", 0)
	d.UpdateExecution(s)
	if pl := d.Place(s); pl.Pod != "" {
		t.Fatalf("small got %q, a pod that ran big's code", pl.Pod)
	}
	b := tenantEx("big", "b", 1)
	d.UpdateExecution(b)
	if pl := d.Place(b); pl.Pod != "used-by-big" {
		t.Errorf("big: %+v, want its own reused pod", pl)
	}
	d.UpdatePod(sharedPod("fresh").Obj())
	if pl := d.Place(s); pl.Pod != "fresh" {
		t.Errorf("small: %+v, want the fresh pod", pl)
	}
}

func TestSessionsOfTwoTenantsWithOneName(t *testing.T) {
	d, _ := sharedDispatcher(t, sandboxv1alpha1.TenantLimits{}, nil)
	bigSes := wrappers.Session("big", "s").SharedPool(platform, "python").UID("big-s").ReadyOn("pod-big").Obj()
	smallSes := wrappers.Session("small", "s").SharedPool(platform, "python").UID("small-s").ReadyOn("pod-small").Obj()
	d.UpdateSession(bigSes)
	d.UpdateSession(smallSes)
	d.UpdatePod(sharedPod("pod-big").HeldBy(bigSes).Obj())
	d.UpdatePod(sharedPod("pod-small").HeldBy(smallSes).Obj())
	for _, ns := range []string{"big", "small"} {
		run := wrappers.Execution(ns, "r").SharedPool(platform, "python").Session("s").UID(ns + "-r").Created(t0).Obj()
		d.UpdateExecution(run)
		if pl := d.Place(run); pl.Pod != "pod-"+ns {
			t.Errorf("%s's run of Session s: %+v, want pod-%s, its own Session's", ns, pl, ns)
		}
	}
}

func TestReservedIdlePodsWaitForNamespacesHoldingNone(t *testing.T) {
	d, _ := sharedDispatcher(t, sandboxv1alpha1.TenantLimits{}, nil)
	pool := wrappers.Pool(platform, "python").Shared(map[string]string{"tenant": "yes"}, sandboxv1alpha1.TenantLimits{}).Obj()
	pool.Spec.Sharing.ReservedIdlePods = 2
	pool.UID, pool.Generation = "pool-uid", 2
	d.UpdatePool(pool)
	for i := range 4 {
		d.UpdatePod(sharedPod(fmt.Sprintf("p%d", i)).Obj())
	}
	var burst []*sandboxv1alpha1.Execution
	for i := range 10 {
		e := tenantEx("big", fmt.Sprintf("b%d", i), i)
		burst = append(burst, e)
		d.UpdateExecution(e)
	}
	if got := placed(d, burst); !slices.Equal(got, []string{"big/b0", "big/b1"}) {
		t.Fatalf("placed %v, want two of the burst: the last two idle pods are kept for namespaces holding none", got)
	}
	small := tenantEx("small", "s", 100)
	d.UpdateExecution(small)
	if pl := d.Place(small); pl.Pod == "" {
		t.Errorf("small: %+v, want a reserved idle pod", pl)
	}
	if got := d.Demand(sharedKey); got != 8 {
		t.Errorf("demand %d, want the 8 of the burst still waiting: the pool grows for them", got)
	}

	// The burst's two runs end: it holds no pod, but eight of its runs wait,
	// more than the reserve covers: the reserved pod is still not its.
	used := []string{d.Place(burst[0]).Pod, d.Place(burst[1]).Pod, d.Place(small).Pod}
	for _, e := range append(burst[:2:2], small) {
		done := e.DeepCopy()
		done.Status.Phase = sandboxv1alpha1.PhaseSucceeded
		d.UpdateExecution(done)
	}
	for _, name := range used { // each used pod is deleted (reusePolicy Never)
		d.DeletePod(sharedPod(name).Obj())
	}
	if got := placed(d, burst[2:]); len(got) != 0 {
		t.Fatalf("placed %v on the last idle pod, which is reserved", got)
	}
	d.UpdatePod(sharedPod("p-new").Obj())
	d.UpdatePod(sharedPod("p-new2").Obj())
	if got := placed(d, burst[2:]); !slices.Equal(got, []string{"big/b2"}) {
		t.Errorf("placed %v, want one more of the burst once three pods are idle (the control)", got)
	}
}

// An Execution's Running status often reaches the dispatcher before its pod's
// claim event. In between, the pod must count as the tenant's: otherwise the
// tenant looks as if it held nothing, and its next runs pass its limit and
// take the reserve (seen in autoscalebench -fairness: a burst's first runs
// took three of five reserved pods).
func TestAClaimSeenFirstInTheStatusCountsForItsTenant(t *testing.T) {
	d, _ := sharedDispatcher(t, sandboxv1alpha1.TenantLimits{MaxPods: ptr.To[int32](1)}, nil)
	for i := range 3 {
		d.UpdatePod(sharedPod(fmt.Sprintf("p%d", i)).Obj())
	}
	first := tenantEx("big", "b0", 0)
	d.UpdateExecution(first)
	pod := d.Place(first).Pod
	if pod == "" {
		t.Fatal("big's first run got no pod")
	}
	running := wrappers.Execution("big", "b0").SharedPool(platform, "python").UID("big-b0").Created(t0).RunningOn(pod).Obj()
	d.UpdateExecution(running) // the claim's pod event has not come yet
	second := tenantEx("big", "b1", 1)
	d.UpdateExecution(second)
	if pl := d.Place(second); pl.Pod != "" || !pl.TenantLimit {
		t.Fatalf("big's second run: %+v, want waiting on its maxPods of 1 (its first holds %s)", pl, pod)
	}
	if got := d.Tenants(sharedKey); len(got) != 1 || got[0] != (sandboxv1alpha1.TenantUsage{Namespace: "big", Pods: 1, Waiting: 1}) {
		t.Errorf("tenants %+v, want big holding 1 with 1 waiting", got)
	}
	small := tenantEx("small", "s", 2)
	d.UpdateExecution(small)
	if pl := d.Place(small); pl.Pod == "" {
		t.Errorf("small: %+v, want one of the idle pods (the control)", pl)
	}
}

// The same for a Session: its Ready status may come before its pod's lease
// event. The pod is its namespace's, and free for no one else, meanwhile.
func TestALeaseSeenFirstInTheSessionsStatusCountsForItsTenant(t *testing.T) {
	d, _ := sharedDispatcher(t, sandboxv1alpha1.TenantLimits{MaxSessions: ptr.To[int32](1)}, nil)
	d.UpdatePod(sharedPod("p0").Obj())
	d.UpdatePod(sharedPod("p1").Obj())
	s1 := wrappers.Session("big", "s1").SharedPool(platform, "python").UID("big-s1").Created(t0).Obj()
	d.UpdateSession(s1)
	pod := d.PlaceSession(s1).Pod
	if pod == "" {
		t.Fatal("big's first Session got no pod")
	}
	d.UpdateSession(wrappers.Session("big", "s1").SharedPool(platform, "python").UID("big-s1").Created(t0).ReadyOn(pod).Obj())
	s2 := wrappers.Session("big", "s2").SharedPool(platform, "python").UID("big-s2").Created(t0.Add(time.Millisecond)).Obj()
	d.UpdateSession(s2)
	if pl := d.PlaceSession(s2); pl.Pod != "" || !pl.TenantLimit {
		t.Fatalf("big's second Session: %+v, want waiting on its maxSessions of 1 (its first holds %s)", pl, pod)
	}
	small := tenantEx("small", "s", 2)
	d.UpdateExecution(small)
	if pl := d.Place(small); pl.Pod == pod || pl.Pod == "" {
		t.Errorf("small: %+v, want the other idle pod, not the one big's Session holds", pl)
	}
}

func TestClaimedSaysWhoseClaimAndHowLongItQueued(t *testing.T) {
	var got []Claimed
	d, _ := sharedDispatcher(t, sandboxv1alpha1.TenantLimits{}, nil, func(o *Options) {
		o.OnClaimed = func(_ types.NamespacedName, c Claimed) { got = append(got, c) }
	})
	ex := tenantEx("small", "s", 0)
	d.UpdateExecution(ex)
	time.Sleep(20 * time.Millisecond) // no pod yet: it queues
	d.UpdatePod(sharedPod("p0").Obj())
	pod := d.Place(ex).Pod
	d.UpdateExecution(wrappers.Execution("small", "s").SharedPool(platform, "python").UID("small-s").Created(t0).RunningOn(pod).Obj())
	if len(got) != 1 || got[0].Namespace != "small" || !got[0].Chosen || got[0].Queued < 20*time.Millisecond || got[0].Queued > time.Second {
		t.Fatalf("claimed %+v, want one of namespace small, chosen after queueing 20 ms or more", got)
	}
}
