package sandboxpod

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// Defaults of spec.limits for the sandbox's writable directories.
var (
	DefaultWorkspaceSize = resource.MustParse("1Gi")
	DefaultTmpSize       = resource.MustParse("256Mi")
)

// gvisorMountPrefix starts the pod annotations by which gVisor's containerd
// shim learns how to mount a pod volume inside the sandbox.
const gvisorMountPrefix = "dev.gvisor.spec.mount."

// scratchVolume is a writable directory of the sandbox: an emptyDir on the
// node, a filesystem of a fixed size inside gVisor.
type scratchVolume struct {
	name, path string
	size       resource.Quantity
}

// scratchVolumes returns /workspace and /tmp with the pool's sizes.
func scratchVolumes(pool *sandboxv1alpha1.SandboxPool) []scratchVolume {
	l := pool.Spec.Limits
	workspace, tmp := DefaultWorkspaceSize, DefaultTmpSize
	if l.WorkspaceSize != nil {
		workspace = *l.WorkspaceSize
	}
	if l.TmpSize != nil {
		tmp = *l.TmpSize
	}
	return []scratchVolume{
		{name: "workspace", path: WorkspaceDir, size: workspace},
		{name: "tmp", path: TmpDir, size: tmp},
	}
}

// ScratchSizes returns the sizes of the pool's /workspace and /tmp.
func ScratchSizes(pool *sandboxv1alpha1.SandboxPool) (workspace, tmp resource.Quantity) {
	v := scratchVolumes(pool)
	return v[0].size, v[1].size
}

// gvisorMountHints makes gVisor mount the volume as a tmpfs of its size inside
// the sandbox, backed by a file in the emptyDir on the node's disk (runsc's
// "self" filestore): the data is not in the pod's memory, and a write past the
// size fails with ENOSPC in the sandbox. The type says what the volume is on
// the node, as GKE's admission controller writes it: "bind" for an emptyDir
// on disk ("tmpfs" would be one in memory, counted against the memory limit);
// gVisor's shim turns the hint of every emptyDir into a tmpfs and tells the
// two apart by that. Runtimes other than gVisor ignore the annotations.
func gvisorMountHints(v scratchVolume) map[string]string {
	p := gvisorMountPrefix + v.name + "."
	return map[string]string{
		p + "type": "bind",
		// One container uses it; "container" keeps the tmpfs for the
		// container's life (a "pod" share would need every container to mount it).
		p + "share":   "container",
		p + "options": fmt.Sprintf("rw,size=%d,mode=1777", v.size.Value()),
	}
}

// evictAt is the emptyDir's sizeLimit. Runtimes without the in-sandbox limit
// are held to the size by the kubelet's eviction; under gVisor the filestore
// that backs the tmpfs may hold a little more than the files in it (it is
// allocated in whole chunks), and the pod must not be evicted before the code
// sees ENOSPC.
func (v scratchVolume) evictAt() resource.Quantity {
	b := v.size.Value()
	return *resource.NewQuantity(b+max(b/8, 16<<20), resource.BinarySI)
}
