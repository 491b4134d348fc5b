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

// defaultIdleTimeout is short because an agent calls tools seconds apart (a
// model's turn), while a sandbox nobody ends (a one-shot client that sent no
// DELETE, a host left open) keeps a warm pod from a pool others share; a
// fresh sandbox from a warm pool is leased in well under a second.
const defaultIdleTimeout = 2 * time.Minute

const idleTimeoutHelp = "close an MCP session's sandbox after this long without a tool call (and, over HTTP, end the MCP session " +
	"after this long without a request), so that a client gone without DELETE holds a warm pod at most this long; " +
	"short because agents call tools seconds apart while a forgotten sandbox keeps a pod from the pool: raise it for " +
	"agents that pause longer and need their variables. A call after it is told its sandbox's state is gone. " +
	"The Sessions' own idle timeout is slightly longer, for when this server dies (0: the pool's sessionIdleTimeout, nothing closed here)"

const sessionTimeoutHelp = "over HTTP, end an MCP session without requests this long, and close its sandbox (0: --idle-timeout, " +
	"or 30m when that is 0); longer keeps the MCP sessions of clients that pause, their sandboxes still closing after --idle-timeout"

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
		idleTimeout    = flag.Duration("idle-timeout", defaultIdleTimeout, idleTimeoutHelp)
		runTimeout     = flag.Duration("run-timeout", 0, "default timeout of run_code (0: the pool's)")
		sessionTimeout = flag.Duration("http-session-timeout", 0, sessionTimeoutHelp)
		tlsCert        = flag.String("tls-cert-file", "", "over HTTP, serve TLS with this certificate (PEM); required on non-loopback addresses, where callers send Kubernetes tokens")
		tlsKey         = flag.String("tls-private-key-file", "", "the private key of --tls-cert-file (PEM)")
	)
	flag.Parse()
	if *pool == "" {
		return errors.New("--pool is required: the SandboxPool whose warm sandboxes the tools use")
	}
	if *idleTimeout < 0 || *idleTimeout > 24*time.Hour {
		return fmt.Errorf("--idle-timeout %s: want 0 (the pool's) up to 24h, as a Session's idle timeout", *idleTimeout)
	}
	if *sessionTimeout == 0 {
		*sessionTimeout = *idleTimeout
	}
	if *sessionTimeout <= 0 {
		*sessionTimeout = 30 * time.Minute // MCP sessions of clients gone without DELETE must not pile up here
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
	// The SDK's session timeout ends the MCP session of a client that left
	// without DELETE (a one-shot CLI, the TypeScript SDK's close()), and so
	// its sandbox; a client that pings still has its sandbox closed after
	// --idle-timeout without a tool call.
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
	log.Info("serving MCP over streamable HTTP", "address", *httpAddr, "tls", *tlsCert != "", "namespace", *namespace, "pool", *pool,
		"idleTimeout", idleTimeout.String(), "sessionTimeout", sessionTimeout.String())
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
