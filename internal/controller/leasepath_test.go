package controller_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// apiCalls records the suite manager's requests to the API server about one
// namespace, as "METHOD resource[/subresource]" in the order they were sent,
// for the specs that count the round trips of a path. Watches are left out:
// they are not round trips of any one path.
type apiCalls struct {
	mu    sync.Mutex
	ns    string
	calls []string
}

var managerCalls = &apiCalls{}

// wrap counts the requests sent through rt.
func (a *apiCalls) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		a.note(r)
		return rt.RoundTrip(r)
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (a *apiCalls) note(r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ns == "" || r.URL.Query().Get("watch") == "true" {
		return
	}
	_, rest, ok := strings.Cut(r.URL.Path, "/namespaces/"+a.ns+"/")
	if !ok {
		return
	}
	// resource/name[/subresource] -> resource[/subresource]
	parts := strings.Split(rest, "/")
	what := parts[0]
	if len(parts) > 2 {
		what += "/" + parts[2]
	}
	a.calls = append(a.calls, r.Method+" "+what)
}

// record starts recording the calls about ns, and forgets earlier ones.
func (a *apiCalls) record(ns string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ns, a.calls = ns, nil
}

// stop ends the recording and returns the calls.
func (a *apiCalls) stop() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ns = ""
	return a.calls
}

var _ = Describe("The lease path", func() {
	It("takes a Session from created to Ready in few API round trips, each one counted", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		// Quiet first: the pool's own writes after its pod became Ready are
		// not the lease's.
		managerCalls.record(ns)
		Eventually(func() []string { calls := managerCalls.stop(); managerCalls.record(ns); return calls }).
			WithPolling(300*time.Millisecond).Should(BeEmpty(), "the pool settles")

		managerCalls.record(ns)
		ses := &sandboxv1alpha1.Session{}
		ses.Namespace, ses.Name = ns, "counted"
		ses.Spec.PoolRef.Name = "python"
		Expect(k8s.Create(ctx, ses)).To(Succeed())
		Eventually(func() sandboxv1alpha1.SessionPhase { return getSession(ns, "counted").Status.Phase }).
			Should(Equal(sandboxv1alpha1.SessionReady))
		calls := managerCalls.stop()

		// What is the lease's, and what else the manager did meanwhile: the
		// pool replaces the pod it lent (a new pod) and Events are sent.
		var lease, other []string
		for _, c := range calls {
			if c == "POST pods" || strings.HasSuffix(c, "events") || strings.Contains(c, "sandboxpools") {
				other = append(other, c)
				continue
			}
			lease = append(lease, c)
		}
		var writes []string
		for _, c := range lease {
			if !strings.HasPrefix(c, "GET ") {
				writes = append(writes, c)
			}
		}
		fmt.Fprintf(GinkgoWriter, "lease path, in order: %v\nalongside it: %v\n", lease, other)
		// The claim of the pod and the Session's Ready status: the commit
		// point needs both, in this order (a pod recorded as the Session's
		// before the Session says so). Fewer would lose the commit point.
		Expect(writes).To(Equal([]string{"PUT pods", "PUT sessions/status"}), "the lease path's writes, in order: %v", lease)
		Expect(slices.ContainsFunc(lease, func(c string) bool { return strings.HasPrefix(c, "GET ") })).To(BeFalse(),
			"reads on the lease path come from the cache: %v", lease)
	})
})
