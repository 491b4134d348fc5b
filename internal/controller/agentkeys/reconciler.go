// Package agentkeys keeps the manager's agent signing keys in step with their
// Secret, in every manager replica.
package agentkeys

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentauth"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// DefaultSecret is the name of the Secret, in the manager's
// namespace, that holds the keys the manager signs agent tokens with.
const DefaultSecret = "warmpool-agent-keys"

// Reconciler keeps the manager's keyring in step with its Secret: it
// creates the Secret with a first key when there is none, loads it, and
// reloads it when an administrator rotates keys (adds one and points
// "current" at it). Pools are then reconciled so that idle pods started with
// an older key are replaced; busy ones keep working with the key they trust.
//
// It runs in every replica, leader or not, of both Deployments: the data
// plane signs its calls to agents with these keys too. Only processes with
// CreateMissing create the Secret; two that both find none both create one,
// the second create fails with AlreadyExists and both load the one stored.
type Reconciler struct {
	client.Client
	Secret types.NamespacedName
	Keys   *agentauth.Keyring
	// PoolEvents wakes every pool after the current key changed. Only the
	// leader's pool controller reads it; a follower's sends find it full and
	// drop (the new leader reconciles every pool when it starts).
	// Nil in a process without the pool controller.
	PoolEvents chan event.GenericEvent
	// CreateMissing creates the Secret when there is none. The data plane
	// leaves that to the controllers: it only reads the keys, and waits for
	// them (its readiness says so) instead of writing a Secret it may not.
	CreateMissing bool
}

// +kubebuilder:rbac:groups="",namespace=warmpool-system,resources=secrets,verbs=get;list;watch;create

func (r *Reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	secret := &corev1.Secret{}
	err := r.Get(ctx, r.Secret, secret)
	if apierrors.IsNotFound(err) && !r.CreateMissing {
		log.V(1).Info("waiting for the controllers to create the agent keys Secret", "secret", r.Secret)
		return ctrl.Result{}, nil // its creation is an event of the watch
	}
	if apierrors.IsNotFound(err) {
		secret = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.Secret.Namespace, Name: r.Secret.Name},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{agentauth.CurrentKey: []byte("k1"), "k1": agentauth.NewSeed()},
		}
		if err := r.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
			return ctrl.Result{}, fmt.Errorf("create agent keys Secret %s: %w", r.Secret, err)
		}
		log.Info("created the agent signing keys Secret", "secret", r.Secret)
		return ctrl.Result{RequeueAfter: time.Second}, nil // load what the cache shows, ours or another replica's
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("read agent keys Secret %s: %w", r.Secret, err)
	}
	before, _ := r.Keys.Current()
	if err := r.Keys.Load(secret.Data); err != nil {
		// Keep signing with the keys loaded before: a broken edit must not cut off every pod.
		log.Error(err, "agent keys Secret is invalid; still using the keys loaded before", "secret", r.Secret)
		return ctrl.Result{}, nil
	}
	after, _ := r.Keys.Current()
	if before != after {
		log.Info("agent signing key loaded", "current", after, "keys", r.Keys.KeyIDs())
		r.wakePools(ctx)
	}
	return ctrl.Result{}, nil
}

// wakePools enqueues every pool, so new pods get the current key.
func (r *Reconciler) wakePools(ctx context.Context) {
	if r.PoolEvents == nil {
		return
	}
	var pools sandboxv1alpha1.SandboxPoolList
	if err := r.List(ctx, &pools); err != nil {
		logf.FromContext(ctx).Error(err, "list pools after a key change")
		return
	}
	for i := range pools.Items {
		select {
		case r.PoolEvents <- event.GenericEvent{Object: &pools.Items[i]}:
		default: // full: those pools see the key on their next reconcile
		}
	}
}

// SetupWithManager watches the one keys Secret (the cache holds no other Secret).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	isKeys := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == r.Secret.Namespace && o.GetName() == r.Secret.Name
	})
	// Start also when the Secret does not exist yet: a one-off event makes the first reconcile create it.
	first := make(chan event.GenericEvent, 1)
	first <- event.GenericEvent{Object: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: r.Secret.Namespace, Name: r.Secret.Name}}}
	return ctrl.NewControllerManagedBy(mgr).
		For(&corev1.Secret{}, builder.WithPredicates(isKeys)).
		WatchesRawSource(source.Channel(first, &handler.EnqueueRequestForObject{})).
		Named("agentkeys").
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false)}).
		Complete(r)
}

// ForNewPods returns the key new pods are started with.
func ForNewPods(keys *agentauth.Keyring) (sandboxpod.AgentKey, error) {
	id, trusted := keys.Current()
	if id == "" {
		return sandboxpod.AgentKey{}, fmt.Errorf("no agent signing key loaded yet")
	}
	return sandboxpod.AgentKey{ID: id, Trusted: trusted}, nil
}
