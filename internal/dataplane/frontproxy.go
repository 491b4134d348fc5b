package dataplane

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	"k8s.io/apiserver/pkg/authentication/request/union"
)

// frontProxyTTL bounds how long a verified front-proxy certificate is trusted
// without verifying it again. The certificate's own expiry and a change of
// the client CA bundle end it sooner.
const frontProxyTTL = 5 * time.Minute

// frontProxyCacheSize bounds the verified certificates kept: kube-apiserver
// presents one (one per replica, and the next one after a rotation).
const frontProxyCacheSize = 16

// frontProxy authenticates requests that kube-apiserver's aggregator relays,
// as k8s.io/apiserver's request-header authenticator does, but verifies the
// aggregator's client certificate once per certificate rather than once per
// request: the aggregator presents the same certificate on every request
// over its long-lived connections, and a chain verification was a tenth of
// the data plane's CPU per run. Anything it cannot authenticate falls through
// to the full delegated chain.
type frontProxy struct {
	verifyOptions func() (x509.VerifyOptions, bool)
	allowedNames  headerrequest.StringSliceProvider
	headers       authenticator.Request
	now           func() time.Time
	verify        func(cert *x509.Certificate, opts x509.VerifyOptions) error

	mu    sync.Mutex
	roots *x509.CertPool // the bundle the cached certificates were verified against
	until map[[sha256.Size]byte]time.Time
}

// withFrontProxyCache puts a caching front-proxy authenticator ahead of the
// delegated chain built from the same request-header configuration.
func withFrontProxyCache(cfg *authenticatorfactory.RequestHeaderConfig, chain authenticator.Request) authenticator.Request {
	if cfg == nil || cfg.CAContentProvider == nil {
		return chain
	}
	fp := &frontProxy{
		verifyOptions: cfg.CAContentProvider.VerifyOptions,
		allowedNames:  cfg.AllowedClientNames,
		headers:       headerrequest.NewDynamic(cfg.UsernameHeaders, cfg.UIDHeaders, cfg.GroupHeaders, cfg.ExtraHeaderPrefixes),
		now:           time.Now,
		verify: func(cert *x509.Certificate, opts x509.VerifyOptions) error {
			_, err := cert.Verify(opts)
			return err
		},
	}
	return union.New(group.NewAuthenticatedGroupAdder(fp), chain)
}

func (f *frontProxy) AuthenticateRequest(req *http.Request) (*authenticator.Response, bool, error) {
	if req.TLS == nil || len(req.TLS.PeerCertificates) == 0 {
		return nil, false, nil
	}
	if err := f.verified(req.TLS.PeerCertificates); err != nil {
		return nil, false, err
	}
	return f.headers.AuthenticateRequest(req)
}

// verified verifies the presented chain unless the same chain was verified
// against the same CA bundle within frontProxyTTL.
func (f *frontProxy) verified(chain []*x509.Certificate) error {
	opts, ok := f.verifyOptions()
	if !ok {
		return fmt.Errorf("no front-proxy client CA loaded")
	}
	leaf := chain[0]
	h := sha256.New()
	for _, c := range chain {
		h.Write(c.Raw)
	}
	var key [sha256.Size]byte
	h.Sum(key[:0])
	now := f.now()

	f.mu.Lock()
	if f.roots != opts.Roots { // the CA bundle changed: trust nothing verified against the old one
		f.roots, f.until = opts.Roots, nil
	}
	until, hit := f.until[key]
	f.mu.Unlock()
	if hit && now.Before(until) {
		return nil
	}

	if opts.Intermediates == nil && len(chain) > 1 {
		opts.Intermediates = x509.NewCertPool()
		for _, c := range chain[1:] {
			opts.Intermediates.AddCert(c)
		}
	}
	opts.CurrentTime = now
	if err := f.verify(leaf, opts); err != nil {
		return err
	}
	if names := f.allowedNames.Value(); len(names) > 0 && !slices.Contains(names, leaf.Subject.CommonName) {
		return fmt.Errorf("x509: subject with cn=%s is not in the allowed list", leaf.Subject.CommonName)
	}
	until = now.Add(frontProxyTTL)
	for _, c := range chain {
		if c.NotAfter.Before(until) {
			until = c.NotAfter
		}
	}
	f.mu.Lock()
	if f.roots == opts.Roots {
		if f.until == nil || len(f.until) >= frontProxyCacheSize {
			f.until = map[[sha256.Size]byte]time.Time{}
		}
		f.until[key] = until
	}
	f.mu.Unlock()
	return nil
}

// awaitFrontProxy waits until cfg names the aggregator's CA and the headers
// it sends the caller in, looking every `every`, for at most timeout. Both
// are loaded by controllers that watch kube-system's
// extension-apiserver-authentication ConfigMap (the caller runs them); a
// data plane that served before they had it would serve every caller the
// aggregator relays as system:anonymous (403). A replica serves no one
// before it can tell who is asking.
func awaitFrontProxy(ctx context.Context, cfg *authenticatorfactory.RequestHeaderConfig, every, timeout time.Duration) error {
	if cfg == nil || cfg.CAContentProvider == nil || cfg.UsernameHeaders == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for len(cfg.CAContentProvider.CurrentCABundleContent()) == 0 || len(cfg.UsernameHeaders.Value()) == 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the front proxy's CA and headers (kube-system/extension-apiserver-authentication) were not there within %s", timeout)
		case <-tick.C:
		}
	}
	return nil
}
