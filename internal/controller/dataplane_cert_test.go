package controller_test

import (
	"crypto/tls"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/warmpool/warmpool/internal/controller"
	"github.com/warmpool/warmpool/internal/dataplane"
)

func apiService(name string) *unstructured.Unstructured {
	as := &unstructured.Unstructured{}
	as.SetAPIVersion("apiregistration.k8s.io/v1")
	as.SetKind("APIService")
	as.SetName(name)
	return as
}

var _ = Describe("Data plane serving certificate", func() {
	It("is issued by the manager and pinned in the APIService, so a redirected Service receives no caller's request", func() {
		real := apiService(dataplane.Version + "." + dataplane.Group)
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(real), real)).To(Succeed())
		bundle, _, _ := unstructured.NestedString(real.Object, "spec", "caBundle")
		skip, _, _ := unstructured.NestedBool(real.Object, "spec", "insecureSkipTLSVerify")
		Expect(bundle).NotTo(BeEmpty(), "the manager wrote its CA into the APIService")
		Expect(skip).To(BeFalse())
		secret := &corev1.Secret{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: managerNamespace, Name: controller.DataPlaneCertSecret}, secret)).To(Succeed())
		Expect(secret.Data).To(HaveKey("ca.crt"))
		ca, _ := base64.StdEncoding.DecodeString(bundle)
		Expect(string(ca)).To(ContainSubstring(string(secret.Data["ca.crt"])))

		// An impostor with a certificate of its own for the Service's very name.
		const svcName, caller = "impostor", "impostor-test"
		certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(svcName+".default.svc", nil, nil)
		Expect(err).NotTo(HaveOccurred())
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		Expect(err).NotTo(HaveOccurred())
		var heard atomic.Int32
		impostor := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// The aggregator's availability probe skips verification (it asks
			// for discovery as system:kube-aggregator); a caller's request
			// carries the caller's name.
			if r.Header.Get("X-Remote-User") == caller {
				heard.Add(1)
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"impostor.warmpool.dev/v1alpha1","resources":[]}`)
		}))
		impostor.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
		impostor.StartTLS()
		DeferCleanup(impostor.Close)
		_, portStr, _ := net.SplitHostPort(impostor.Listener.Addr().String())
		port, _ := strconv.Atoi(portStr)

		// What redirecting the data plane's Service would do: the manager's CA
		// pinned, another server behind the address.
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: svcName},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost",
				Ports: []corev1.ServicePort{{Name: "https", Port: int32(port), TargetPort: intstr.FromInt32(int32(port))}}}}
		Expect(k8s.Create(ctx, svc)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, svc))).To(Succeed()) })
		fake := apiService("v1alpha1.impostor.warmpool.dev")
		fake.Object["spec"] = map[string]any{"group": "impostor.warmpool.dev", "version": "v1alpha1",
			"groupPriorityMinimum": int64(1000), "versionPriority": int64(15), "caBundle": bundle,
			"service": map[string]any{"namespace": "default", "name": svcName, "port": int64(port)}}
		Expect(k8s.Create(ctx, fake)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, fake))).To(Succeed()) })

		admin, err := env.UserConfig(caller, "system:masters")
		Expect(err).NotTo(HaveOccurred())
		hc, err := rest.HTTPClientFor(admin)
		Expect(err).NotTo(HaveOccurred())
		get := func() int {
			resp, err := hc.Get(strings.TrimSuffix(admin.Host, "/") + "/apis/impostor.warmpool.dev/v1alpha1/namespaces/default/sessions/x/executions?id=1")
			if err != nil {
				return 0
			}
			_ = resp.Body.Close()
			return resp.StatusCode
		}
		// 404 until the aggregator has taken the APIService in, then 503: the
		// impostor's certificate is refused.
		Eventually(get, 30*time.Second, 100*time.Millisecond).Should(Equal(http.StatusServiceUnavailable))
		Consistently(get, 3*time.Second, 250*time.Millisecond).Should(Equal(http.StatusServiceUnavailable))
		Expect(heard.Load()).To(BeZero(), "the aggregator sent a caller's request to a server the manager did not certify")

		// Control: without the pin the same impostor hears the caller (so the
		// refusal above is the pin's doing).
		Expect(k8s.Patch(ctx, fake, client.RawPatch("application/merge-patch+json",
			[]byte(`{"spec":{"caBundle":null,"insecureSkipTLSVerify":true}}`)))).To(Succeed())
		Eventually(func() int32 { get(); return heard.Load() }, 60*time.Second, 250*time.Millisecond).Should(BeNumerically(">", 0))
	})
})
