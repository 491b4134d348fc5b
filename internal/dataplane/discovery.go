package dataplane

import (
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The aggregator checks availability with GET /apis/GROUP/VERSION and, with
// no aggregated discovery at /apis, builds discovery from the same
// APIResourceList. Only the subresources (and runs/exec, a one-call run that
// creates its Session) are listed: the Session objects are
// sandbox.warmpool.dev's, and a "sessions" resource here would make kubectl
// resolve "session/NAME" to this group, which has no objects.

func apiResources(w http.ResponseWriter, _ *http.Request) {
	sub := func(name string, verbs ...string) metav1.APIResource {
		return metav1.APIResource{Name: "sessions/" + name, Namespaced: true, Kind: "Session", Verbs: verbs}
	}
	writeJSON(w, http.StatusOK, &metav1.APIResourceList{
		TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
		GroupVersion: Group + "/" + Version,
		APIResources: []metav1.APIResource{
			sub(SubExec, "create"), sub(SubInterrupt, "create"), sub(SubBridge, "create"),
			sub(SubExecutions, "get"), sub(SubVariables, "get"), sub(SubFiles, "get", "update"), sub(SubReset, "create"),
			sub(SubSnapshot, "get"), sub(SubRestore, "create"), sub(SubFork, "create"),
			{Name: ResourceRuns + "/" + SubExec, Namespaced: true, Kind: "Run", Verbs: []string{"create"}},
		},
	})
}

func apiGroup(w http.ResponseWriter, _ *http.Request) {
	gv := metav1.GroupVersionForDiscovery{GroupVersion: Group + "/" + Version, Version: Version}
	writeJSON(w, http.StatusOK, &metav1.APIGroup{TypeMeta: metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"},
		Name: Group, Versions: []metav1.GroupVersionForDiscovery{gv}, PreferredVersion: gv})
}
