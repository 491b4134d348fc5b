package mcpserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/warmpool/warmpool/pkg/sessions"
)

// Caller is whom a tool call acts for, with a client that holds its credentials.
type Caller struct {
	// Name keys the caller: a Session is used only by calls of the caller
	// that leased it.
	Name string
	// Sessions creates Sessions, runs code in them and ends them.
	Sessions *sessions.Client
}

// NewCaller returns the Caller name, acting with cfg.
func NewCaller(name string, cfg *rest.Config) (*Caller, error) {
	c, err := sessions.New(cfg)
	if err != nil {
		return nil, err
	}
	return &Caller{Name: name, Sessions: c}, nil
}

// end ends a Session with the caller's current credentials (the first
// call's token may have expired since): spec.close, so the Session stays
// listed, Closed, until its TTL; a delete when the caller may not patch it.
func (c *Caller) end(ctx context.Context, ses *sessions.Session) error {
	if err := c.Sessions.Open(ses.Namespace, ses.Name).End(ctx); err != nil {
		return fmt.Errorf("close session %s/%s: %w", ses.Namespace, ses.Name, err)
	}
	return nil
}

// OwnCredentials acts with the server's own credentials (its kubeconfig or
// service account) for every caller: for stdio, where the caller is the
// user who started the server.
func OwnCredentials(cfg *rest.Config) (func(*mcp.CallToolRequest) (*Caller, error), error) {
	c, err := NewCaller("server", cfg)
	if err != nil {
		return nil, err
	}
	return func(*mcp.CallToolRequest) (*Caller, error) { return c, nil }, nil
}

// maxCallers bounds the clients and verified tokens kept for callers.
const maxCallers = 256

// BearerCredentials acts with the bearer token of each HTTP request, sent
// on to kube-apiserver, so that RBAC decides for the caller: the server
// needs no rights of its own. The caller is the user kube-apiserver named
// for the token (RequireKubernetesToken verified it), so one user's sandbox
// is not another's, and a user whose token rotates keeps its own. base gives
// the API server's address and CA; its own credentials are dropped.
func BearerCredentials(base *rest.Config) func(*mcp.CallToolRequest) (*Caller, error) {
	var mu sync.Mutex
	callers := map[string]*Caller{}
	return func(req *mcp.CallToolRequest) (*Caller, error) {
		token := bearerToken(req.Extra)
		if token == "" || req.Extra.TokenInfo == nil || req.Extra.TokenInfo.UserID == "" {
			return nil, errors.New("no verified bearer token: send a Kubernetes token in the Authorization header")
		}
		key := tokenKey(token)
		mu.Lock()
		defer mu.Unlock()
		if c := callers[key]; c != nil && c.Name == req.Extra.TokenInfo.UserID {
			return c, nil
		}
		cfg := rest.AnonymousClientConfig(base)
		cfg.BearerToken = token
		c, err := NewCaller(req.Extra.TokenInfo.UserID, cfg)
		if err != nil {
			return nil, fmt.Errorf("client for the caller: %w", err)
		}
		forgetOne(callers)
		callers[key] = c
		return c, nil
	}
}

// forgetOne drops an entry of a full cache; it is rebuilt if its caller comes back.
func forgetOne[V any](m map[string]V) {
	if len(m) < maxCallers {
		return
	}
	for k := range m {
		delete(m, k)
		return
	}
}

func tokenKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func bearerToken(extra *mcp.RequestExtra) string {
	if extra == nil || extra.Header == nil {
		return ""
	}
	return bearerOf(extra.Header)
}

func bearerOf(h http.Header) string {
	v := h.Get("Authorization")
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	return ""
}

// verifiedFor is how long a token kube-apiserver accepted is taken as
// verified without asking again.
const verifiedFor = time.Minute

// TokenVerifier verifies a bearer token by asking kube-apiserver whom it
// belongs to (a SelfSubjectReview, which every authenticated user may make)
// and names that user as the token's UserID: the streamable HTTP handler
// then serves an MCP session only to requests of the user who started it,
// so a caller who learns another's session ID can neither call its tools,
// nor answer its sampling requests, nor end it.
func TokenVerifier(base *rest.Config) auth.TokenVerifier {
	var mu sync.Mutex
	verified := map[string]auth.TokenInfo{}
	return func(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		key := tokenKey(token)
		mu.Lock()
		info, ok := verified[key]
		mu.Unlock()
		if ok && time.Now().Before(info.Expiration) {
			return &info, nil
		}
		cfg := rest.AnonymousClientConfig(base)
		cfg.BearerToken = token
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("client for the caller: %w", err)
		}
		review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		switch {
		case apierrors.IsUnauthorized(err):
			return nil, fmt.Errorf("%w: kube-apiserver does not accept this bearer token", auth.ErrInvalidToken)
		case err != nil:
			return nil, fmt.Errorf("verify the bearer token with kube-apiserver: %w", err)
		case review.Status.UserInfo.Username == "":
			return nil, fmt.Errorf("%w: kube-apiserver names no user for this bearer token", auth.ErrInvalidToken)
		}
		info = auth.TokenInfo{UserID: review.Status.UserInfo.Username, Expiration: time.Now().Add(verifiedFor)}
		mu.Lock()
		forgetOne(verified)
		verified[key] = info
		mu.Unlock()
		return &info, nil
	}
}

// RequireKubernetesToken serves next only to requests with a bearer token
// kube-apiserver accepts (401 otherwise, as the MCP authorization spec has
// it), each MCP session bound to the token's user (TokenVerifier).
func RequireKubernetesToken(base *rest.Config, next http.Handler) http.Handler {
	verified := auth.RequireBearerToken(TokenVerifier(base), nil)(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if bearerOf(r.Header) == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="warmpool", error="invalid_request", error_description="send a Kubernetes bearer token"`)
			http.Error(w, "a Kubernetes bearer token is required (Authorization: Bearer TOKEN): calls act as its user", http.StatusUnauthorized)
			return
		}
		verified.ServeHTTP(w, r)
	})
}
