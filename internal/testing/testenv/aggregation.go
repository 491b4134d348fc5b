package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// frontProxyClient is the common name of the certificate kube-apiserver's
// aggregator presents to aggregated API servers.
const frontProxyClient = "front-proxy-client"

// enableAggregation gives envtest's kube-apiserver the front-proxy flags a
// real control plane has (kubeadm sets the same), so that it can proxy an
// APIService to an aggregated server and pass the caller on in headers.
func enableAggregation(env *envtest.Environment) error {
	dir, err := os.MkdirTemp("", "warmpool-front-proxy-")
	if err != nil {
		return err
	}
	caCert, caKey, err := newCA("front-proxy-ca")
	if err != nil {
		return err
	}
	clientCert, clientKey, err := signClient(caCert, caKey, frontProxyClient)
	if err != nil {
		return err
	}
	files := map[string][]byte{"ca.crt": caCert.Raw, "client.crt": clientCert}
	for name, der := range files {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			return err
		}
	}
	keyDER, err := x509.MarshalECPrivateKey(clientKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "client.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	args := env.ControlPlane.GetAPIServer().Configure()
	args.Set("requestheader-client-ca-file", filepath.Join(dir, "ca.crt"))
	args.Set("requestheader-allowed-names", frontProxyClient)
	args.Set("requestheader-username-headers", "X-Remote-User")
	args.Set("requestheader-group-headers", "X-Remote-Group")
	args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
	args.Set("proxy-client-cert-file", filepath.Join(dir, "client.crt"))
	args.Set("proxy-client-key-file", filepath.Join(dir, "client.key"))
	return nil
}

func newCA(cn string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func signClient(ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	return der, key, err
}

// FreePort returns a loopback TCP port nothing listens on now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// KubeconfigFor writes a kubeconfig of a new user of the control plane (a
// client certificate), for servers that read one (delegated authentication).
func (e *Env) KubeconfigFor(user string, groups ...string) (string, error) {
	u, err := e.ControlPlane.AddUser(envtest.User{Name: user, Groups: groups}, nil)
	if err != nil {
		return "", err
	}
	data, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp("", "warmpool-kubeconfig-")
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	_, err = f.Write(data)
	return f.Name(), err
}

// RegisterAPIService points kube-apiserver's aggregator at a server on
// loopback port: a Service of type ExternalName (the aggregator resolves it
// itself; envtest runs no endpoints controller) of 127.0.0.1, not
// "localhost": the aggregator would try ::1 first, where another process
// (a test of another package running alongside) may listen on the same port
// number, and its answers would pass for the data plane's. And an APIService for
// group/version without a caBundle (the server's manager sets it), and waits
// until the aggregator reports it Available.
func (e *Env) RegisterAPIService(ctx context.Context, group, version string, port int) error {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "warmpool-data-plane"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "127.0.0.1",
			Ports: []corev1.ServicePort{{Name: "https", Port: int32(port), TargetPort: intstr.FromInt32(int32(port))}}}}
	if err := e.Client.Create(ctx, svc); err != nil {
		return fmt.Errorf("service for the APIService: %w", err)
	}
	as := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": version + "." + group},
		"spec": map[string]any{
			"group": group, "version": version, "groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
			"service": map[string]any{"namespace": "default", "name": svc.Name, "port": int64(port)},
		},
	}}
	if err := e.Client.Create(ctx, as); err != nil {
		return fmt.Errorf("create APIService: %w", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := &unstructured.Unstructured{}
		got.SetAPIVersion("apiregistration.k8s.io/v1")
		got.SetKind("APIService")
		err := e.Client.Get(ctx, client.ObjectKey{Name: version + "." + group}, got)
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Available" && m["status"] == "True" {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("APIService %s.%s not Available after 60 s (err %v, conditions %v)", version, group, err, conds)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// UserConfig returns a rest.Config of a new user of the control plane,
// authenticated by a client certificate (no impersonation): what a user's
// kubeconfig with a certificate gives.
func (e *Env) UserConfig(user string, groups ...string) (*rest.Config, error) {
	u, err := e.ControlPlane.AddUser(envtest.User{Name: user, Groups: groups}, nil)
	if err != nil {
		return nil, err
	}
	return u.Config(), nil
}
