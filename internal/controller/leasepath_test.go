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
// namespace, as "METHOD resource[/subresource] name" in the order they were sent,
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
		resp, err := rt.RoundTrip(r)
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		a.note(r, code)
		return resp, err
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (a *apiCalls) note(r *http.Request, code int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ns == "" || r.URL.Query().Get("watch") == "true" {
		return
	}
	_, rest, ok := strings.Cut(r.URL.Path, "/namespaces/"+a.ns+"/")
	if !ok {
		return
	}
	// resource/name[/subresource] -> resource[/subresource] name
	parts := strings.Split(rest, "/")
	what := parts[0]
	if len(parts) > 2 {
		what += "/" + parts[2]
	}
	if len(parts) > 1 {
		what += " " + parts[1]
	}
	// A write refused for a stale resourceVersion is retried by its
	// controller: a round trip, but not a write; marked so specs can tell.
	if code == http.StatusConflict {
		what += " (conflict)"
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

		// What is the lease's (calls about the Session and the pod it leased),
		// and what else the manager did meanwhile: the pool replaces the pod
		// it lent (a new pod, its agent key), Events are sent. Which of those
		// land inside the window depends on how busy the machine is.
		leased := getSession(ns, "counted").Status.PodName
		var lease, other []string
		for _, c := range calls {
			method, target, _ := strings.Cut(c, " ")
			resource, name, _ := strings.Cut(target, " ")
			name, conflict := strings.CutSuffix(name, " (conflict)")
			switch {
			case conflict:
				// Under load the cache can be behind a kubelet's status
				// write; the retry that follows is counted as the write.
				other = append(other, c)
			case (strings.HasPrefix(resource, "pods") && name == leased) ||
				(strings.HasPrefix(resource, "sessions") && name == "counted"):
				lease = append(lease, method+" "+resource)
			default:
				other = append(other, c)
			}
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
