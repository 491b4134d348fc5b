package dataplane

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// Each replica opens its connection to a Session's agent when the Session
// becomes Ready (it asks the agent how it is, through the gate), not at
// the Session's first run: the first run then costs what the next ones do,
// without the connection's set-up or the agent's version question. The
// connection stays in the gate's pool of idle connections (30 s).

// warmTimeout bounds one warm-up.
const warmTimeout = 2 * time.Second

// warmer is the Session informer's handler that warms up Ready Sessions.
func (s *Server) warmer() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerDetailedFuncs{
		// Not the Sessions of the informer's first list (a restart): only
		// leases made while this replica serves.
		AddFunc: func(obj any, initial bool) {
			if ses, ok := obj.(*sandboxv1alpha1.Session); ok && !initial && readyOn(ses) != "" {
				s.warmSoon(ses)
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			old, ok1 := oldObj.(*sandboxv1alpha1.Session)
			ses, ok2 := obj.(*sandboxv1alpha1.Session)
			if ok1 && ok2 && readyOn(ses) != "" && readyOn(ses) != readyOn(old) {
				s.warmSoon(ses)
			}
		},
	}
}

// warmSoon warms ses up in the background, unless warmConcurrency warm-ups
// are under way already (a burst of leases warms what it can).
func (s *Server) warmSoon(ses *sandboxv1alpha1.Session) {
	select {
	case s.warming <- struct{}{}:
		go func() {
			defer func() { <-s.warming }()
			s.warm(ses)
		}()
	default:
	}
}

// warmConcurrency bounds the warm-ups under way at once.
const warmConcurrency = 32

// readyOn is the UID of the pod a Ready Session holds, "" when it is not Ready.
func readyOn(ses *sandboxv1alpha1.Session) string {
	if ses.Status.Phase != sandboxv1alpha1.SessionReady || ses.DeletionTimestamp != nil {
		return ""
	}
	return string(ses.Status.PodUID)
}

// warm opens the agent of ses's pod and asks it how it is. The claim,
// written alongside the Ready status, may reach the cache after it: the
// warm-up waits for the informer's news of it (sessionChanges), not on a
// clock. Failures are the first run's to find and report: nothing is done
// about them here.
func (s *Server) warm(ses *sandboxv1alpha1.Session) {
	if s.Gate == nil || (s.KeysLoaded != nil && !s.KeysLoaded()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), warmTimeout)
	defer cancel()
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := s.Client.Get(ctx, ses.PoolKey(), pool); err != nil {
		return
	}
	key := client.ObjectKeyFromObject(ses)
	for {
		changed := s.ready.subscribe(key)
		pod := &corev1.Pod{}
		err := s.Client.Get(ctx, ses.PodKey(), pod)
		if err == nil {
			var agent *agentgate.Agent
			if agent, err = s.Gate.Open(ctx, pool, pod, agentgate.ForSession(ses)); err == nil {
				s.ready.unsubscribe(key, changed)
				_, _ = agent.Ready(ctx)
				return
			}
		}
		if !apierrors.IsNotFound(err) && !agentgate.IsRefused(err) {
			s.ready.unsubscribe(key, changed)
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			s.ready.unsubscribe(key, changed)
			return
		}
	}
}

// agentsAhead asks the agent of each Ready idle pod which protocol it
// speaks as this replica's informer hears of the pod (agentcheck, in the
// background, a few at a time): the question is then asked before a lease,
// not at the first run of the Session that gets the pod.
func (s *Server) agentsAhead() toolscache.ResourceEventHandler {
	agents := s.Gate.Agents()
	seen := func(obj any) {
		if pod, ok := obj.(*corev1.Pod); ok && pod.Labels[sandboxpod.LabelPool] != "" &&
			pod.DeletionTimestamp == nil && sandboxpod.IsIdle(pod) {
			agents.Usable(pod)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				agents.Forget(pod.UID)
			}
		},
	}
}
