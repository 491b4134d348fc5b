// Package objectstore starts a real S3-compatible object store for the
// suites: SeaweedFS's weed server on loopback, built from Go modules by
// hack/seaweedfs.sh. The snapshot store of suspended Sessions is tested
// against it, not against a mock of S3.
package objectstore

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warmpool/warmpool/internal/snapshotstore"
	"github.com/warmpool/warmpool/internal/testing/testenv"
)

// Credentials of the store's one identity.
const (
	AccessKeyID     = "warmpool-test"
	SecretAccessKey = "warmpool-test-secret"
)

// Server is a running weed server.
type Server struct {
	// Endpoint is host:port of its S3 API (plain HTTP).
	Endpoint string
	dir      string
	cmd      *exec.Cmd
	log      *bytes.Buffer
}

// Binary is the weed binary: $WARMPOOL_SEAWEEDFS (which `make test` sets),
// else what hack/seaweedfs.sh builds or finds in the cache.
func Binary() (string, error) {
	if b := os.Getenv("WARMPOOL_SEAWEEDFS"); b != "" {
		return b, nil
	}
	out, err := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "seaweedfs.sh")).Output()
	if err != nil {
		return "", fmt.Errorf("hack/seaweedfs.sh (builds SeaweedFS, the suites' S3 store): %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Start starts a store in a new directory and waits until its S3 API answers.
func Start() (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "warmpool-s3-")
	if err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`{"identities":[{"name":"warmpool","credentials":[{"accessKey":%q,"secretKey":%q}],`+
		`"actions":["Admin","Read","Write","List","Tagging"]}]}`, AccessKeyID, SecretAccessKey)
	if err := os.WriteFile(filepath.Join(dir, "s3.json"), []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
		return nil, err
	}
	ports := make([]int, 8)
	for i := range ports {
		if ports[i], err = testenv.FreePort(); err != nil {
			return nil, err
		}
	}
	p := func(i int) string { return strconv.Itoa(ports[i]) }
	s := &Server{Endpoint: "127.0.0.1:" + p(6), dir: dir, log: &bytes.Buffer{}}
	s.cmd = exec.Command(bin, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-dir="+filepath.Join(dir, "data"),
		"-master.port="+p(0), "-master.port.grpc="+p(1), "-volume.port="+p(2), "-volume.port.grpc="+p(3),
		"-filer", "-filer.port="+p(4), "-filer.port.grpc="+p(5), "-s3", "-s3.port="+p(6), "-s3.port.grpc="+p(7),
		"-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.config="+filepath.Join(dir, "s3.json"),
		"-volume.max=0", "-master.volumeSizeLimitMB=64")
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	if err := s.waitReady(60 * time.Second); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// waitReady waits until a bucket can be made, which needs the master, a
// volume and the filer up, not only the S3 listener.
func (s *Server) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if s.cmd.ProcessState != nil {
			break
		}
		var st *snapshotstore.Store
		if st, err = s.Store("ready-check", ""); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err = st.EnsureBucket(ctx)
			cancel()
			if err == nil {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("the S3 store at %s did not come up: %v\n%s", s.Endpoint, err, tail(s.log.String(), 3000))
}

// Config is a snapshot store configuration for a bucket of this server.
func (s *Server) Config(bucket, prefix string) snapshotstore.Config {
	return snapshotstore.Config{Endpoint: s.Endpoint, Bucket: bucket, Prefix: prefix, Insecure: true, Region: "us-east-1",
		AccessKeyID: AccessKeyID, SecretAccessKey: SecretAccessKey}
}

// Store is a snapshot store on a bucket of this server, with a fixed test key.
func (s *Server) Store(bucket, prefix string) (*snapshotstore.Store, error) {
	return snapshotstore.New(s.Config(bucket, prefix), bytes.Repeat([]byte{7}, 32))
}

// Stop kills the server (its process group) and removes its data.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		_ = s.cmd.Wait()
	}
	_ = os.RemoveAll(s.dir)
}

// Healthy reports whether the S3 listener answers.
func (s *Server) Healthy() bool {
	resp, err := http.Get("http://" + s.Endpoint + "/")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return true
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
