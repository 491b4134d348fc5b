package dataplane

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
)

// Each replica opens its connection to a Session's agent when the Session
// becomes Ready (it asks the agent how it is, through the gate), not at
// the Session's first run: the first run then costs what the next ones do,
// without the connection's set-up or the agent's version question. The
// connection stays in the gate's pool of idle connections (30 s).

// warmTimeout bounds one warm-up; warmTries how often the claim, written
// alongside the Ready status, is waited for.
const (
	warmTimeout = 2 * time.Second
	warmTries   = 5
)

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

// warm opens the agent of ses's pod and asks it how it is. Failures are
// the first run's to find and report: nothing is done about them here.
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
	wait := 10 * time.Millisecond
	for range warmTries {
		pod := &corev1.Pod{}
		if err := s.Client.Get(ctx, ses.PodKey(), pod); err == nil {
			agent, err := s.Gate.Open(ctx, pool, pod, agentgate.ForSession(ses))
			if err == nil {
				_, _ = agent.Ready(ctx)
				return
			}
			if !agentgate.IsRefused(err) {
				return
			}
		} else if client.IgnoreNotFound(err) != nil {
			return
		}
		// The claim, written alongside the Ready status, is not in the cache yet.
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait *= 2
	}
}
