// This file is not part of warmpool's packages (testdata, so ./... skips it): hack/gvisor.sh copies it into its
// copy of gVisor's runsc/cgroup package and runs it before building runsc, so
// the patch to loadPathsHelper is tested against the mount tables it is for.

package cgroup

import (
	"strings"
	"testing"
)

func TestLoadPathsIgnoresSubdirectoryBindMounts(t *testing.T) {
	const procCgroup = `12:memory:/system.slice/containerd.service
11:pids:/system.slice/containerd.service
4:cpu,cpuacct:/system.slice/containerd.service
1:name=systemd:/system.slice/containerd.service
`
	for _, tc := range []struct {
		name      string
		mountinfo string
		want      map[string]string
	}{
		{
			// A kind node on a cgroup v1 host: its entrypoint bind-mounts the
			// kubelet's cgroups onto themselves, which runsc used to read as
			// further hierarchies of the same controllers.
			name: "kind node",
			mountinfo: `1070 1069 0:33 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
1071 1069 0:34 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,pids
1072 1069 0:35 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu,cpuacct
1073 1069 0:36 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,xattr,name=systemd
1090 1070 0:33 /kubelet /sys/fs/cgroup/memory/kubelet rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
1091 1070 0:33 /kubelet.slice /sys/fs/cgroup/memory/kubelet.slice rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
1092 1071 0:34 /kubelet /sys/fs/cgroup/pids/kubelet rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,pids
1093 1071 0:34 /kubelet.slice /sys/fs/cgroup/pids/kubelet.slice rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,pids
1094 1072 0:35 /kubelet.slice /sys/fs/cgroup/cpu,cpuacct/kubelet.slice rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu,cpuacct
1095 1073 0:36 /kubelet /sys/fs/cgroup/systemd/kubelet rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,xattr,name=systemd
`,
			want: map[string]string{
				"memory":  "/system.slice/containerd.service",
				"pids":    "/system.slice/containerd.service",
				"cpu":     "/system.slice/containerd.service",
				"cpuacct": "/system.slice/containerd.service",
				"systemd": "/system.slice/containerd.service",
			},
		},
		{
			// A container that sees the host's cgroup paths and has its own
			// cgroup mounted at the hierarchy's place: what the code was
			// written for, unchanged.
			name: "nested container",
			mountinfo: `70 69 0:33 /docker/abc /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
71 69 0:34 /docker/abc /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,pids
72 69 0:35 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu,cpuacct
73 69 0:36 /docker/abc /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,xattr,name=systemd
`,
			want: map[string]string{
				"memory":  "../../system.slice/containerd.service",
				"pids":    "../../system.slice/containerd.service",
				"cpu":     "../../system.slice/containerd.service",
				"cpuacct": "../../system.slice/containerd.service",
				"systemd": "../../system.slice/containerd.service",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := loadPathsHelper(strings.NewReader(procCgroup), strings.NewReader(tc.mountinfo), false)
			if err != nil {
				t.Fatalf("loadPathsHelper: %v", err)
			}
			for ctrl, want := range tc.want {
				if got[ctrl] != want {
					t.Errorf("path of %s = %q, want %q", ctrl, got[ctrl], want)
				}
			}
		})
	}
}
