package mcpserver

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"k8s.io/client-go/rest"

	"github.com/warmpool/warmpool/pkg/sessions"
)

// OwnCredentials acts with the server's own credentials (its kubeconfig or
// service account) for every caller: for stdio, where the caller is the
// user who started the server.
func OwnCredentials(cfg *rest.Config) (func(*mcp.CallToolRequest) (*sessions.Client, string, error), error) {
	c, err := sessions.New(cfg)
	if err != nil {
		return nil, err
	}
	return func(*mcp.CallToolRequest) (*sessions.Client, string, error) { return c, "server", nil }, nil
}

// maxCallers bounds the clients kept for callers' tokens.
const maxCallers = 256

// BearerCredentials acts with the bearer token of each HTTP request, sent
// on to kube-apiserver, so that RBAC decides for the caller: the server
// needs no rights of its own, and one caller cannot use another's sandbox.
// base gives the API server's address and CA; its own credentials are
// dropped.
func BearerCredentials(base *rest.Config) func(*mcp.CallToolRequest) (*sessions.Client, string, error) {
	var mu sync.Mutex
	clients := map[string]*sessions.Client{}
	return func(req *mcp.CallToolRequest) (*sessions.Client, string, error) {
		token := bearerToken(req.Extra)
		if token == "" {
			return nil, "", errors.New("no bearer token: send a Kubernetes token in the Authorization header")
		}
		sum := sha256.Sum256([]byte(token))
		key := hex.EncodeToString(sum[:])
		mu.Lock()
		defer mu.Unlock()
		if c := clients[key]; c != nil {
			return c, key, nil
		}
		cfg := rest.AnonymousClientConfig(base)
		cfg.BearerToken = token
		c, err := sessions.New(cfg)
		if err != nil {
			return nil, "", fmt.Errorf("client for the caller: %w", err)
		}
		if len(clients) >= maxCallers {
			for k := range clients { // forget one; it is rebuilt if its caller comes back
				delete(clients, k)
				break
			}
		}
		clients[key] = c
		return c, key, nil
	}
}

func bearerToken(extra *mcp.RequestExtra) string {
	if extra == nil || extra.Header == nil {
		return ""
	}
	v := extra.Header.Get("Authorization")
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	return ""
}

// RequireBearer refuses HTTP requests without a bearer token before they
// reach the MCP handler (401, as the MCP authorization spec has it).
func RequireBearer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if bearerToken(&mcp.RequestExtra{Header: r.Header}) == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="warmpool", error="invalid_request", error_description="send a Kubernetes bearer token"`)
			http.Error(w, "a Kubernetes bearer token is required (Authorization: Bearer TOKEN): calls act as its user", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
