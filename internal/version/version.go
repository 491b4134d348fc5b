// Package version says which build of warmpool is running: the manager
// exports it as warmpool_build_info, the kubectl plugin prints it.
package version

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Version and Commit are set at link time (-ldflags "-X
// github.com/warmpool/warmpool/internal/version.Version=v0.3.0"); a plain
// `go build` in a git checkout falls back to the commit Go stamps into the
// binary, so a locally built manager still says what it runs.
var (
	Version = "dev"
	Commit  = ""
)

// Info is a build's identity.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// Get returns this binary's Info.
func Get() Info {
	info := Info{Version: Version, Commit: Commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if info.Commit == "" {
		info.Commit = "unknown"
		if bi, ok := debug.ReadBuildInfo(); ok {
			var rev, dirty string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					if s.Value == "true" {
						dirty = "-dirty"
					}
				}
			}
			if rev != "" {
				info.Commit = rev + dirty
			}
		}
	}
	return info
}

// Build is the build's short name: its release, or for a development build
// "dev+" and the commit (12 digits) it was built from, so that two
// development builds can be told apart (the pool status counts agents by it).
func Build() string {
	info := Get()
	if info.Version != "dev" || info.Commit == "unknown" {
		return info.Version
	}
	commit, dirty, _ := strings.Cut(info.Commit, "-")
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if dirty != "" {
		commit += "-" + dirty
	}
	return "dev+" + commit
}
