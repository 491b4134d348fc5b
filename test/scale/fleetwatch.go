package main

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/test/scale/fleet"
)

// fleetWatch feeds the stand-in agents from a watch of the sandbox pods: an
// agent listens from the moment kwok gives its pod an IP until the pod is gone.
type fleetWatch struct {
	fleet  *fleet.Fleet
	cancel context.CancelFunc
	errs   atomic.Int64
}

func watchFleet(ctx context.Context, c *cluster, port int) (*fleetWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	fw := &fleetWatch{fleet: fleet.New(port), cancel: cancel}
	factory := informers.NewSharedInformerFactoryWithOptions(c.cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = sandboxpod.LabelPool
	}))
	inf := factory.Core().V1().Pods().Informer()
	sync := func(obj any, deleted bool) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		if err := fw.fleet.Sync(pod, deleted); err != nil && fw.errs.Add(1) <= 5 {
			fmt.Fprintln(os.Stderr, "scale: fleet:", err)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { sync(obj, false) },
		UpdateFunc: func(_, obj any) { sync(obj, false) },
		DeleteFunc: func(obj any) { sync(obj, true) },
	}); err != nil {
		cancel()
		return nil, err
	}
	factory.Start(ctx.Done())
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	if !toolscache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
		cancel()
		return nil, fmt.Errorf("the fleet's pod watch did not sync")
	}
	return fw, nil
}

func (fw *fleetWatch) stop() {
	fw.cancel()
	fw.fleet.Stop()
}
