// Package modelendpoint resolves a pool's spec.llm to the ModelEndpoint its
// runs' llm_query calls go to (Endpoints), and reports each endpoint's
// readiness in its status (Reconciler).
package modelendpoint

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/llm"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=modelendpoints,verbs=get;list;watch
// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=modelendpoints/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get

// Endpoints resolves a pool's spec.llm to the endpoint its Executions'
// model calls go to. The namespace check and the key are read at a run's
// first model call (not cached, not at every run's start): a rotated key is
// used from the next run on, and runs that ask no model cost no reads.
type Endpoints struct {
	// Client reads Endpoints (cached); APIReader reads the key's Secret
	// and namespaces, which the manager does not watch.
	Client    client.Client
	APIReader client.Reader
	// Namespace holds the keys' Secrets (the manager's).
	Namespace string
	LLM       *llm.Client
}

// Bridge returns the answerer of the model calls of a run of pool, and the
// most calls a run may make; nil when the pool names no endpoint. An endpoint
// that cannot be used gives an answerer that says why to every call: the
// code sees the reason as the RuntimeError of its llm_query.
func (m *Endpoints) Bridge(ctx context.Context, pool *sandboxv1alpha1.SandboxPool) (func(context.Context, protocol.BridgeCall) protocol.BridgeAnswer, int) {
	if pool.Spec.LLM == nil || m == nil {
		return nil, 0
	}
	name := pool.Spec.LLM.Endpoint
	me := &sandboxv1alpha1.ModelEndpoint{}
	if err := m.Client.Get(ctx, types.NamespacedName{Name: name}, me); err != nil {
		if apierrors.IsNotFound(err) {
			err = fmt.Errorf("ModelEndpoint %q does not exist (ask your platform team, or fix spec.llm.endpoint)", name)
		} else {
			err = fmt.Errorf("ModelEndpoint %q: %w", name, err)
		}
		return refuse(pool, err), 0
	}
	var once sync.Once
	var answer func(context.Context, protocol.BridgeCall) protocol.BridgeAnswer
	return func(ctx context.Context, call protocol.BridgeCall) protocol.BridgeAnswer {
		once.Do(func() {
			if ep, err := m.endpoint(ctx, pool.Namespace, me); err != nil {
				answer = refuse(pool, err)
			} else {
				answer = m.LLM.Answerer(ep)
			}
		})
		return answer(ctx, call)
	}, int(me.Spec.Limits.MaxCallsPerRun)
}

// refuse answers every call with why the pool's endpoint cannot be used.
func refuse(pool *sandboxv1alpha1.SandboxPool, err error) func(context.Context, protocol.BridgeCall) protocol.BridgeAnswer {
	msg := fmt.Sprintf("pool %s: %v", pool.Name, err)
	return func(context.Context, protocol.BridgeCall) protocol.BridgeAnswer {
		return protocol.BridgeAnswer{Error: msg}
	}
}

// endpoint checks that me admits namespace and reads its key.
func (m *Endpoints) endpoint(ctx context.Context, namespace string, me *sandboxv1alpha1.ModelEndpoint) (llm.Endpoint, error) {
	name := me.Name
	if sel := me.Spec.NamespaceSelector; sel != nil && (len(sel.MatchLabels) > 0 || len(sel.MatchExpressions) > 0) {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			return llm.Endpoint{}, fmt.Errorf("ModelEndpoint %q: namespaceSelector: %w", name, err)
		}
		ns := &corev1.Namespace{}
		if err := m.APIReader.Get(ctx, types.NamespacedName{Name: namespace}, ns); err != nil {
			return llm.Endpoint{}, fmt.Errorf("namespace %s: %w", namespace, err)
		}
		if !s.Matches(labels.Set(ns.Labels)) {
			return llm.Endpoint{}, fmt.Errorf("ModelEndpoint %q does not admit namespace %s (its namespaceSelector)", name, namespace)
		}
	}
	ep := llm.Endpoint{Name: name, URL: me.Spec.URL, Model: me.Spec.Model,
		MaxCallsPerRun: int(me.Spec.Limits.MaxCallsPerRun), MaxPromptBytes: int(me.Spec.Limits.MaxPromptBytes),
		MaxTokens: int(me.Spec.Limits.MaxTokens), Timeout: 60 * time.Second}
	if t := me.Spec.Limits.CallTimeout; t != nil {
		ep.Timeout = t.Duration
	}
	if ref := me.Spec.APIKeySecretRef; ref != nil {
		key, err := m.apiKey(ctx, ref)
		if err != nil {
			return llm.Endpoint{}, fmt.Errorf("ModelEndpoint %q: %w", name, err)
		}
		ep.APIKey = key
	}
	return ep, nil
}

func (m *Endpoints) apiKey(ctx context.Context, ref *sandboxv1alpha1.SecretKeyReference) (string, error) {
	key := ref.Key
	if key == "" {
		key = "apiKey"
	}
	sec := &corev1.Secret{}
	if err := m.APIReader.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: ref.Name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("its key's Secret %s/%s does not exist", m.Namespace, ref.Name)
		}
		return "", fmt.Errorf("its key's Secret %s/%s: %w", m.Namespace, ref.Name, err)
	}
	v, ok := sec.Data[key]
	if !ok || len(v) == 0 {
		return "", fmt.Errorf("its key's Secret %s/%s has no key %q", m.Namespace, ref.Name, key)
	}
	return strings.TrimSpace(string(v)), nil
}

// Reconciler keeps each ModelEndpoint's Ready condition: whether
// its key can be read, so a platform team sees a broken endpoint before a
// user's code does.
type Reconciler struct {
	Endpoints *Endpoints
}

// Reconcile checks one ModelEndpoint, and again every few minutes (its
// Secret is not watched).
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	me := &sandboxv1alpha1.ModelEndpoint{}
	if err := r.Endpoints.Client.Get(ctx, req.NamespacedName, me); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	cond := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "KeyFound",
		Message: "the API key's Secret is readable", ObservedGeneration: me.Generation}
	if me.Spec.APIKeySecretRef == nil {
		cond.Reason, cond.Message = "NoKey", "calls carry no API key"
	} else if _, err := r.Endpoints.apiKey(ctx, me.Spec.APIKeySecretRef); err != nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "KeyUnavailable", err.Error()
	}
	if meta.IsStatusConditionPresentAndEqual(me.Status.Conditions, cond.Type, cond.Status) {
		if c := meta.FindStatusCondition(me.Status.Conditions, cond.Type); c.Message == cond.Message && c.ObservedGeneration == cond.ObservedGeneration {
			return ctrl.Result{RequeueAfter: 5 * time.Minute}, nil
		}
	}
	meta.SetStatusCondition(&me.Status.Conditions, cond)
	if err := r.Endpoints.Client.Status().Update(ctx, me); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	return ctrl.Result{RequeueAfter: 5 * time.Minute}, nil
}

// SetupWithManager registers the reconciler.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&sandboxv1alpha1.ModelEndpoint{}).Named("modelendpoint").Complete(r)
}
