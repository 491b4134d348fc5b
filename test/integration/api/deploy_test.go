package api_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/warmpool/warmpool/internal/testing/testenv"
)

// kustomizeBuild renders a kustomization with the Makefile's pinned kustomize.
func kustomizeBuild(dir string) []*unstructured.Unstructured {
	root := testenv.RepoRoot()
	bin := filepath.Join(root, "bin", "kustomize")
	if _, err := os.Stat(bin); err != nil {
		out, err := exec.Command("make", "-C", root, "kustomize").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "make kustomize: %s", out)
	}
	out, err := exec.Command(bin, "build", filepath.Join(root, dir)).Output()
	Expect(err).NotTo(HaveOccurred(), "kustomize build %s", dir)
	var objs []*unstructured.Unstructured
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		Expect(err).NotTo(HaveOccurred())
		obj := &unstructured.Unstructured{}
		Expect(yaml.Unmarshal(doc, &obj.Object)).To(Succeed())
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
}

var _ = Describe("Deploy manifests", func() {
	It("are accepted by the API server, as kubectl apply --server-side sends them", func() {
		kinds := map[string]int{}
		for _, dir := range []string{"config/default", "config/runtimeclass", "config/apiservice"} {
			for _, obj := range kustomizeBuild(dir) {
				obj.SetManagedFields(nil)
				Expect(k8s.Patch(ctx, obj, client.Apply, client.FieldOwner("warmpool-test"), client.ForceOwnership)).
					To(Succeed(), "%s %s", obj.GetKind(), obj.GetName())
				kinds[obj.GetKind()]++
			}
		}
		Expect(kinds).To(HaveKeyWithValue("CustomResourceDefinition", 4))
		Expect(kinds).To(HaveKeyWithValue("Deployment", 2), "the controllers and the data plane")
		Expect(kinds).To(HaveKeyWithValue("RuntimeClass", 1))
		Expect(kinds).To(HaveKeyWithValue("APIService", 1))
		Expect(kinds).To(HaveKey("ClusterRole"))
		// The APIService (applied without namePrefix) names the data plane's
		// Service as config/default renders it.
		as := &unstructured.Unstructured{}
		as.SetAPIVersion("apiregistration.k8s.io/v1")
		as.SetKind("APIService")
		Expect(k8s.Get(ctx, client.ObjectKey{Name: "v1alpha1.data.warmpool.dev"}, as)).To(Succeed())
		svcNS, _, _ := unstructured.NestedString(as.Object, "spec", "service", "namespace")
		svcName, _, _ := unstructured.NestedString(as.Object, "spec", "service", "name")
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: svcNS, Name: svcName}, &corev1.Service{})).To(Succeed())
		// The pools' default runtimeClassName must exist under that very name.
		Expect(k8s.Get(ctx, client.ObjectKey{Name: "gvisor"}, &nodev1.RuntimeClass{})).To(Succeed())
	})
})
