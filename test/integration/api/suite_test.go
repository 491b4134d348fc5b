// Package api_test proves the API a user gets from the CRDs alone: validation,
// defaults and subresources, against a real kube-apiserver and etcd.
package api_test

import (
	"context"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/warmpool/warmpool/internal/testing/testenv"
)

var (
	env *testenv.Env
	k8s client.Client
	ctx = context.Background()
)

func TestAPI(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "API validation suite")
}

var _ = BeforeSuite(func() {
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8s = env.Client
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

// newNamespace creates a namespace of its own for one test.
func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "api-"}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	DeferCleanup(func() { _ = k8s.Delete(ctx, ns) })
	return ns.Name
}
