package dataplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "front-proxy-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

func (ca *testCA) client(t testing.TB, cn string, notAfter time.Time) *x509.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert
}

// relayed is a request as the aggregator relays it: its client certificate
// and the caller's identity in headers.
func relayed(cert *x509.Certificate, user string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/apis/data.warmpool.dev/v1alpha1/namespaces/ns/sessions/s/exec", nil)
	req.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
	req.Header.Set("X-Remote-User", user)
	req.Header.Set("X-Remote-Group", "team")
	return req
}

type frontProxyRig struct {
	fp       *frontProxy
	roots    *x509.CertPool
	now      time.Time
	verifies int
}

func newFrontProxyRig(roots *x509.CertPool, allowed ...string) *frontProxyRig {
	rig := &frontProxyRig{roots: roots, now: time.Now()}
	rig.fp = &frontProxy{
		verifyOptions: func() (x509.VerifyOptions, bool) {
			return x509.VerifyOptions{Roots: rig.roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, true
		},
		allowedNames: headerrequest.StaticStringSlice(allowed),
		headers: headerrequest.NewDynamic(headerrequest.StaticStringSlice{"X-Remote-User"}, headerrequest.StaticStringSlice{},
			headerrequest.StaticStringSlice{"X-Remote-Group"}, headerrequest.StaticStringSlice{"X-Remote-Extra-"}),
		now: func() time.Time { return rig.now },
		verify: func(cert *x509.Certificate, opts x509.VerifyOptions) error {
			rig.verifies++
			_, err := cert.Verify(opts)
			return err
		},
	}
	return rig
}

func (r *frontProxyRig) auth(t *testing.T, req *http.Request) (*authenticator.Response, error) {
	t.Helper()
	resp, ok, err := r.fp.AuthenticateRequest(req)
	if err == nil && !ok {
		t.Fatalf("neither authenticated nor refused")
	}
	return resp, err
}

func TestFrontProxyVerifiesACertificateOnceAndTrustsItsHeaders(t *testing.T) {
	ca := newTestCA(t)
	rig := newFrontProxyRig(ca.pool, "front-proxy-client")
	cert := ca.client(t, "front-proxy-client", time.Now().Add(time.Hour))
	for _, user := range []string{"alice", "bob", "alice"} {
		req := relayed(cert, user)
		resp, err := rig.auth(t, req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.User.GetName() != user || len(resp.User.GetGroups()) != 1 || resp.User.GetGroups()[0] != "team" {
			t.Fatalf("want %s in team, got %+v", user, resp.User)
		}
		if req.Header.Get("X-Remote-User") != "" {
			t.Fatalf("the identity headers must be cleared once read")
		}
	}
	if rig.verifies != 1 {
		t.Fatalf("want the chain verified once for three requests over it, got %d", rig.verifies)
	}

	rig.now = rig.now.Add(frontProxyTTL + time.Second)
	if _, err := rig.auth(t, relayed(cert, "alice")); err != nil {
		t.Fatal(err)
	}
	if rig.verifies != 2 {
		t.Fatalf("want the chain verified again after %s, got %d verifications", frontProxyTTL, rig.verifies)
	}
}

// Headers naming any user are trusted only from the front proxy: a
// certificate of another CA, or of the right CA with another name, is
// refused every time, and never enters the cache.
func TestFrontProxyRefusesOtherCertificates(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	rig := newFrontProxyRig(ca.pool, "front-proxy-client")
	for name, cert := range map[string]*x509.Certificate{
		"another CA":         other.client(t, "front-proxy-client", time.Now().Add(time.Hour)),
		"a name not allowed": ca.client(t, "mallory", time.Now().Add(time.Hour)),
	} {
		for range 2 {
			resp, err := rig.auth(t, relayed(cert, "system:admin"))
			if err == nil {
				t.Fatalf("%s: want a refusal, authenticated as %v", name, resp.User)
			}
		}
	}
	if rig.verifies != 4 {
		t.Fatalf("a refused certificate must be verified again each time, got %d verifications for 4 requests", rig.verifies)
	}
}

// When the front-proxy CA bundle changes (a rotation removes a CA), a
// certificate verified against the old bundle is verified again, and
// refused if the new bundle does not trust it.
func TestFrontProxyForgetsWhatTheOldCABundleVerified(t *testing.T) {
	ca, next := newTestCA(t), newTestCA(t)
	rig := newFrontProxyRig(ca.pool)
	cert := ca.client(t, "front-proxy-client", time.Now().Add(time.Hour))
	if _, err := rig.auth(t, relayed(cert, "alice")); err != nil {
		t.Fatal(err)
	}
	rig.roots = next.pool
	if resp, err := rig.auth(t, relayed(cert, "alice")); err == nil {
		t.Fatalf("a certificate of a CA no longer trusted authenticated %v", resp.User)
	}
}

// A certificate is trusted from the cache no longer than it is valid.
func TestFrontProxyTrustsACertificateNoLongerThanItsExpiry(t *testing.T) {
	ca := newTestCA(t)
	rig := newFrontProxyRig(ca.pool)
	cert := ca.client(t, "front-proxy-client", rig.now.Add(time.Minute))
	if _, err := rig.auth(t, relayed(cert, "alice")); err != nil {
		t.Fatal(err)
	}
	rig.now = rig.now.Add(2 * time.Minute)
	if resp, err := rig.auth(t, relayed(cert, "alice")); err == nil {
		t.Fatalf("an expired certificate authenticated %v", resp.User)
	}
}

// The verification saved per relayed request, side by side with
// k8s.io/apiserver's request-header authenticator over the same request.
func BenchmarkFrontProxyAuthentication(b *testing.B) {
	ca := newTestCA(b)
	cert := ca.client(b, "front-proxy-client", time.Now().Add(time.Hour))
	opts := func() (x509.VerifyOptions, bool) {
		return x509.VerifyOptions{Roots: ca.pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, true
	}
	headers := headerrequest.NewDynamic(headerrequest.StaticStringSlice{"X-Remote-User"}, headerrequest.StaticStringSlice{},
		headerrequest.StaticStringSlice{"X-Remote-Group"}, headerrequest.StaticStringSlice{"X-Remote-Extra-"})
	allowed := headerrequest.StaticStringSlice{"front-proxy-client"}
	for _, bc := range []struct {
		name string
		auth authenticator.Request
	}{
		{"verified-per-request", x509request.NewDynamicCAVerifier(opts, headers, allowed)},
		{"verified-per-certificate", &frontProxy{verifyOptions: opts, allowedNames: allowed, headers: headers, now: time.Now,
			verify: func(c *x509.Certificate, o x509.VerifyOptions) error { _, err := c.Verify(o); return err }}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, ok, err := bc.auth.AuthenticateRequest(relayed(cert, "alice")); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
	}
}

// lateConfig is kube-system/extension-apiserver-authentication as a data
// plane's controllers find it when it starts beside a kube-apiserver that
// has not written it yet, or before their watch has synced: nothing, until
// the load'th look.
type lateConfig struct {
	mu      sync.Mutex
	looks   int
	load    int
	ca      []byte
	headers []string
}

func (l *lateConfig) look() {
	l.looks++
	if l.looks >= l.load {
		l.ca, l.headers = []byte("a CA bundle"), []string{"X-Remote-User"}
	}
}

func (l *lateConfig) Name() string { return "late" }
func (l *lateConfig) CurrentCABundleContent() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.look()
	return l.ca
}
func (l *lateConfig) VerifyOptions() (x509.VerifyOptions, bool) { return x509.VerifyOptions{}, false }
func (l *lateConfig) AddListener(dynamiccertificates.Listener)  {}
func (l *lateConfig) usernameHeaders() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.headers
}
func (l *lateConfig) loaded() (int, []byte, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.looks, l.ca, l.headers
}

func (l *lateConfig) config() *authenticatorfactory.RequestHeaderConfig {
	return &authenticatorfactory.RequestHeaderConfig{CAContentProvider: l,
		UsernameHeaders: headerrequest.StringSliceProviderFunc(l.usernameHeaders)}
}

// Regression (the controller suite, when a data-plane spec ran first): a data
// plane that listened before its controllers had the front proxy's CA and
// headers served the aggregator's callers as system:anonymous (403 on
// runs/exec). It now waits for them.
func TestDataPlaneWaitsForTheFrontProxyBeforeServing(t *testing.T) {
	late := &lateConfig{load: 3}
	if err := awaitFrontProxy(t.Context(), late.config(), time.Millisecond, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if looks, ca, headers := late.loaded(); looks < 3 || len(ca) == 0 || len(headers) == 0 {
		t.Fatalf("returned after %d looks with CA %q and headers %v, want after the third look with both", looks, ca, headers)
	}

	never := &lateConfig{load: 1 << 30}
	start := time.Now()
	err := awaitFrontProxy(t.Context(), never.config(), time.Millisecond, 50*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "extension-apiserver-authentication") {
		t.Fatalf("err %v, want one naming the ConfigMap that never came", err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Errorf("gave up after %s, want its whole timeout", waited)
	}
	if err := awaitFrontProxy(t.Context(), nil, time.Millisecond, time.Millisecond); err != nil {
		t.Errorf("no front proxy delegated: %v, want nil at once", err)
	}
}
