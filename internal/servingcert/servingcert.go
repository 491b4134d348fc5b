// Package servingcert keeps the data plane's serving certificate: it issues
// a CA and a certificate for the Service that the data plane's APIService
// names, keeps both in a Secret that every manager replica serves from, and
// puts the CA in the APIService's caBundle, so that kube-apiserver verifies
// whom it sends callers' requests (and their identities) to. It renews the
// pair well before it expires; the old CA stays in the bundle until the new
// certificate has reached every replica.
package servingcert

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// Validity of a CA and certificate pair.
	Validity = 365 * 24 * time.Hour
	// RenewBefore: a pair this close to its end is replaced.
	RenewBefore = 30 * 24 * time.Hour
	// KeyCA, KeyPreviousCA: the Secret's keys besides tls.crt and tls.key.
	KeyCA         = "ca.crt"
	KeyPreviousCA = "ca-previous.crt"
	// refresh is how often a replica looks at the Secret and the APIService
	// once both are in place; absent is how soon it looks again while the
	// APIService does not exist (a deployment that applies it after the
	// manager).
	refresh = time.Hour
	absent  = 5 * time.Second
)

// ErrNoAPIService: the APIService to serve does not exist (yet).
var ErrNoAPIService = errors.New("the data plane's APIService does not exist")

// Manager issues, stores, serves and publishes the certificate. It is a
// dynamiccertificates.CertKeyContentProvider for the data plane's listener.
type Manager struct {
	// Client writes the Secret and the APIService; Reader reads them around
	// any cache (the manager caches one Secret only, the agent keys).
	Client client.Client
	Reader client.Reader
	// Secret holds the pair; APIService is the data plane's (VERSION.GROUP).
	Secret     types.NamespacedName
	APIService string
	Clock      clock.PassiveClock
	Log        logr.Logger

	mu        sync.Mutex
	cert, key []byte
	listeners []dynamiccertificates.Listener
}

var _ dynamiccertificates.CertKeyContentProvider = &Manager{}

// Name names the provider in k8s.io/apiserver's logs.
func (m *Manager) Name() string { return "warmpool-data-plane-serving-cert" }

// CurrentCertKeyContent returns the pair served now (nil before Ensure).
func (m *Manager) CurrentCertKeyContent() ([]byte, []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cert, m.key
}

// AddListener registers the listener's serving controller for changes.
func (m *Manager) AddListener(l dynamiccertificates.Listener) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listeners = append(m.listeners, l)
}

// NeedLeaderElection is false: every replica serves, so every replica keeps
// its certificate current.
func (m *Manager) NeedLeaderElection() bool { return false }

// Start looks again every hour (every few seconds while the APIService is
// missing) until ctx ends.
func (m *Manager) Start(ctx context.Context) error {
	for first := true; ; first = false {
		wait := refresh
		if cert, _ := m.CurrentCertKeyContent(); first && len(cert) > 0 {
			// The data plane made it current as it started: nothing to redo now.
		} else if err := m.Ensure(ctx); errors.Is(err, ErrNoAPIService) {
			wait = absent
		} else if err != nil {
			m.Log.Error(err, "keep the data plane's serving certificate")
			wait = time.Minute
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// Ensure makes the Secret hold a current pair for the APIService's Service,
// serves it, and makes the APIService trust its CA.
func (m *Manager) Ensure(ctx context.Context) error {
	as := &unstructured.Unstructured{}
	as.SetAPIVersion("apiregistration.k8s.io/v1")
	as.SetKind("APIService")
	if err := m.Reader.Get(ctx, client.ObjectKey{Name: m.APIService}, as); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return ErrNoAPIService
		}
		return fmt.Errorf("read APIService %s: %w", m.APIService, err)
	}
	name, _, _ := unstructured.NestedString(as.Object, "spec", "service", "name")
	ns, _, _ := unstructured.NestedString(as.Object, "spec", "service", "namespace")
	if name == "" || ns == "" {
		return fmt.Errorf("APIService %s names no service", m.APIService)
	}
	// kube-apiserver checks the certificate against SERVICE.NAMESPACE.svc.
	dns := []string{name + "." + ns + ".svc", name + "." + ns + ".svc.cluster.local"}
	sec, err := m.current(ctx, dns)
	if err != nil {
		return err
	}
	// The APIService trusts the CA before any replica serves a certificate it
	// signed: a manager that stops between the two leaves the old pair served.
	if err := m.publish(ctx, as, bundle(sec, m.Clock.Now())); err != nil {
		return err
	}
	m.serve(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	return nil
}

// current returns the Secret with a pair valid for dns, issuing one if it
// holds none, or one for other names, or one near its end. Replicas that
// race to issue settle on whichever write landed first.
func (m *Manager) current(ctx context.Context, dns []string) (*corev1.Secret, error) {
	for range 3 {
		sec := &corev1.Secret{}
		err := m.Reader.Get(ctx, m.Secret, sec)
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("read Secret %s: %w", m.Secret, err)
		}
		exists := err == nil
		if exists && usable(sec, dns, m.Clock.Now()) {
			return sec, nil
		}
		ca, cert, key, err := issue(dns, m.Clock.Now())
		if err != nil {
			return nil, err
		}
		if !exists {
			sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: m.Secret.Namespace, Name: m.Secret.Name,
				Labels: map[string]string{"app.kubernetes.io/name": "warmpool", "app.kubernetes.io/component": "data-plane"}},
				Type: corev1.SecretTypeTLS}
		}
		previous := sec.Data[KeyCA]
		sec.Data = map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key, KeyCA: ca}
		if len(previous) > 0 {
			// Replicas that have not read the new pair yet serve the old one.
			sec.Data[KeyPreviousCA] = previous
		}
		if exists {
			err = m.Client.Update(ctx, sec)
		} else {
			err = m.Client.Create(ctx, sec)
		}
		switch {
		case err == nil:
			m.Log.Info("issued the data plane's serving certificate", "secret", m.Secret.String(), "dns", dns)
			return sec, nil
		case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
			continue // another replica issued one: use it
		default:
			return nil, fmt.Errorf("store Secret %s: %w", m.Secret, err)
		}
	}
	return nil, fmt.Errorf("store Secret %s: it kept changing under this replica", m.Secret)
}

func (m *Manager) serve(cert, key []byte) {
	m.mu.Lock()
	changed := !bytes.Equal(cert, m.cert) || !bytes.Equal(key, m.key)
	m.cert, m.key = cert, key
	ls := slices.Clone(m.listeners)
	m.mu.Unlock()
	if changed {
		for _, l := range ls {
			l.Enqueue()
		}
	}
}

// publish puts the bundle in the APIService, and turns off the skipping of
// verification that an older manifest may have set.
func (m *Manager) publish(ctx context.Context, as *unstructured.Unstructured, caBundle []byte) error {
	have, _, _ := unstructured.NestedString(as.Object, "spec", "caBundle")
	skip, _, _ := unstructured.NestedBool(as.Object, "spec", "insecureSkipTLSVerify")
	want := base64.StdEncoding.EncodeToString(caBundle)
	if have == want && !skip {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"caBundle": want, "insecureSkipTLSVerify": false}})
	if err := m.Client.Patch(ctx, as, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("put the data plane's CA in APIService %s: %w", m.APIService, err)
	}
	m.Log.Info("the APIService trusts the data plane's CA", "apiService", m.APIService)
	return nil
}

// bundle is the CA and, while it is valid, the one before it.
func bundle(sec *corev1.Secret, now time.Time) []byte {
	out := slices.Clone(sec.Data[KeyCA])
	if prev := sec.Data[KeyPreviousCA]; len(prev) > 0 {
		if c, err := parseCert(prev); err == nil && now.Before(c.NotAfter) {
			out = append(out, prev...)
		}
	}
	return out
}

// usable reports whether the Secret's pair serves dns, is signed by its CA
// and is not near its end.
func usable(sec *corev1.Secret, dns []string, now time.Time) bool {
	if _, err := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]); err != nil {
		return false
	}
	cert, err := parseCert(sec.Data[corev1.TLSCertKey])
	if err != nil || now.Add(RenewBefore).After(cert.NotAfter) {
		return false
	}
	ca, err := parseCert(sec.Data[KeyCA])
	if err != nil {
		return false
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, name := range dns {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, CurrentTime: now}); err != nil {
			return false
		}
	}
	return true
}

func parseCert(p []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(p)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("no PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

// issue makes a CA and a serving certificate for dns signed by it, PEM-encoded.
func issue(dns []string, now time.Time) (ca, cert, key []byte, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "warmpool-data-plane-ca@" + now.UTC().Format(time.RFC3339)},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(Validity),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("issue the data plane's CA: %w", err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: dns[0]}, DNSNames: dns,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(Validity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("issue the data plane's certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(leafKey)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
