// Command warmpool-mcp is an MCP server whose tools run code in warmpool
// Sessions: one stateful, gVisor-isolated Python sandbox per MCP client
// session. Over stdio (the default) it acts as the user of its kubeconfig;
// over streamable HTTP (--http) each request acts as the Kubernetes user of
// its own bearer token.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/warmpool/warmpool/internal/mcpserver"
)

var version = "dev"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "warmpool-mcp:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		kubeconfig     = flag.String("kubeconfig", "", "kubeconfig file (default: in-cluster, $KUBECONFIG or ~/.kube/config)")
		kubeContext    = flag.String("context", "", "kubeconfig context")
		namespace      = flag.String("namespace", "", "namespace of the pool and the Sessions (default: the context's)")
		pool           = flag.String("pool", "", "SandboxPool to lease sandboxes from (required)")
		httpAddr       = flag.String("http", "", "serve streamable HTTP on this address (e.g. 127.0.0.1:8080) instead of stdio")
		ownCredentials = flag.Bool("http-own-credentials", false, "over HTTP, act with this server's credentials instead of each caller's bearer token (loopback addresses only)")
		idleTimeout    = flag.Duration("idle-timeout", 15*time.Minute, "a sandbox unused this long is closed (covers clients that vanish)")
		runTimeout     = flag.Duration("run-timeout", 0, "default timeout of run_code (0: the pool's)")
		sessionTimeout = flag.Duration("http-session-timeout", 30*time.Minute, "over HTTP, an MCP session without requests this long ends, and its sandbox closes")
		tlsCert        = flag.String("tls-cert-file", "", "over HTTP, serve TLS with this certificate (PEM); required on non-loopback addresses, where callers send Kubernetes tokens")
		tlsKey         = flag.String("tls-private-key-file", "", "the private key of --tls-cert-file (PEM)")
	)
	flag.Parse()
	if *pool == "" {
		return errors.New("--pool is required: the SandboxPool whose warm sandboxes the tools use")
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: *kubeContext})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return fmt.Errorf("load Kubernetes credentials: %w", err)
	}
	if *namespace == "" {
		if *namespace, _, err = cc.Namespace(); err != nil {
			return err
		}
	}
	// stdout is the protocol's over stdio: logs go to stderr.
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{})
	mc := mcpserver.Config{Namespace: *namespace, Pool: *pool, IdleTimeout: *idleTimeout, RunTimeout: *runTimeout,
		Version: version, Log: log}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *httpAddr == "" {
		if mc.Credentials, err = mcpserver.OwnCredentials(cfg); err != nil {
			return err
		}
		s := mcpserver.New(mc)
		defer s.CloseAll()
		err := s.MCP().Run(ctx, &mcp.StdioTransport{})
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	if err := checkListen(*httpAddr, *ownCredentials, *tlsCert, *tlsKey); err != nil {
		return err
	}
	if *ownCredentials {
		if mc.Credentials, err = mcpserver.OwnCredentials(cfg); err != nil {
			return err
		}
	} else {
		mc.Credentials = mcpserver.BearerCredentials(cfg)
	}
	s := mcpserver.New(mc)
	var handler http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.MCP() },
		&mcp.StreamableHTTPOptions{SessionTimeout: *sessionTimeout})
	if !*ownCredentials {
		handler = mcpserver.RequireKubernetesToken(cfg, handler)
	}
	srv := &http.Server{Addr: *httpAddr, Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx) // no new requests, and the running ones end (or are cut off)
	}()
	log.Info("serving MCP over streamable HTTP", "address", *httpAddr, "tls", *tlsCert != "", "namespace", *namespace, "pool", *pool)
	if *tlsCert != "" {
		err = srv.ListenAndServeTLS(*tlsCert, *tlsKey)
	} else {
		err = srv.ListenAndServe()
	}
	if !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	// ListenAndServe returns as Shutdown begins: close the sandboxes once no
	// handler can lease another.
	<-stopped
	s.CloseAll()
	return nil
}

// checkListen refuses an HTTP setup that would hand out credentials: this
// server's own rights to anyone who reaches a non-loopback address, or
// callers' Kubernetes tokens sent in clear text over the network.
func checkListen(addr string, ownCredentials bool, tlsCert, tlsKey string) error {
	if (tlsCert == "") != (tlsKey == "") {
		return errors.New("--tls-cert-file and --tls-private-key-file go together")
	}
	if loopback(addr) {
		return nil
	}
	if ownCredentials {
		return fmt.Errorf("--http-own-credentials serves anyone who reaches %s with this server's rights: use a loopback address", addr)
	}
	if tlsCert == "" {
		return fmt.Errorf("callers send Kubernetes tokens to %s: serve TLS (--tls-cert-file, --tls-private-key-file) or use a loopback address", addr)
	}
	return nil
}

func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
