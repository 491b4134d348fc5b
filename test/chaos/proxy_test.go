package chaos

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// lagProxy stands between the managers and the API server. While a lag is
// set it holds back every read of a pod watch stream by that long, so the
// managers' pod cache falls behind their Execution cache, as it can on a
// busy cluster: what the controllers must confirm with a live read.
type lagProxy struct {
	srv *httptest.Server
	lag atomic.Int64 // nanoseconds; 0: none
}

func newLagProxy(t *testing.T, cfg *rest.Config) *lagProxy {
	target, err := url.Parse(cfg.Host)
	must(t, err)
	tr, err := rest.TransportFor(cfg) // the API server sees the proxy's (admin) credentials
	must(t, err)
	p := &lagProxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = tr
	rp.FlushInterval = -1                    // watch events go through as they come
	rp.ErrorLog = log.New(io.Discard, "", 0) // refused while the API server restarts: expected
	rp.ModifyResponse = func(resp *http.Response) error {
		q := resp.Request.URL.Query()
		if strings.HasSuffix(resp.Request.URL.Path, "/pods") && q.Get("watch") != "" && q.Get("watch") != "false" {
			resp.Body = &laggingBody{ReadCloser: resp.Body, lag: &p.lag}
		}
		return nil
	}
	p.srv = httptest.NewUnstartedServer(rp)
	p.srv.StartTLS()
	t.Cleanup(p.srv.Close)
	return p
}

// kubeconfig points a client at the proxy (its certificate is a test one).
func (p *lagProxy) kubeconfig() []byte {
	return []byte(`apiVersion: v1
kind: Config
clusters: [{name: chaos, cluster: {server: "` + p.srv.URL + `", insecure-skip-tls-verify: true}}]
users: [{name: chaos, user: {token: proxied}}]
contexts: [{name: chaos, context: {cluster: chaos, user: chaos}}]
current-context: chaos
`)
}

type laggingBody struct {
	io.ReadCloser
	lag *atomic.Int64
}

func (b *laggingBody) Read(buf []byte) (int, error) {
	n, err := b.ReadCloser.Read(buf)
	if d := time.Duration(b.lag.Load()); d > 0 && n > 0 {
		time.Sleep(d)
	}
	return n, err
}
