package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/warmpool/warmpool/internal/agent/interpreter"
	"github.com/warmpool/warmpool/internal/agent/workspace"
	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/snapshot"
)

// Snapshots (pkg/snapshot): the interpreter pickles its namespace into a
// file in a directory the agent makes for each snapshot, the agent adds the
// workspace as a tar when asked, hashes both and streams them behind the
// manifest. Restore reads the sections into such files, checks their hashes
// and only then lets the interpreter load the namespace: a torn or altered
// snapshot is refused before anything of it runs. Files are opened through
// an os.Root of that directory, so code in the sandbox that swaps them for
// symlinks cannot make the agent read or write elsewhere.

// errSealed refuses what would change a sealed sandbox.
var errSealed = errors.New("this sandbox was sealed by a snapshot that moves its Session to another pod (a suspend): " +
	"nothing more runs here; retry once the Session is Suspended or Ready again")

func writeSealed(w http.ResponseWriter) {
	writeJSON(w, http.StatusConflict, protocol.ErrorBody{Error: errSealed.Error(), Reason: protocol.ReasonSealed})
}

// scratch makes a private directory for one snapshot's files.
func (s *Server) scratch() (*os.Root, func(), error) {
	dir, err := os.MkdirTemp(s.cfg.SnapshotDir, "snapshot-")
	if err != nil {
		return nil, nil, fmt.Errorf("make a directory for the snapshot: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("open the snapshot's directory: %w", err)
	}
	return root, func() { _ = root.Close(); _ = os.RemoveAll(dir) }, nil
}

func (s *Server) maxSnapshotBytes(r *http.Request) (int64, error) {
	limit := s.cfg.MaxSnapshotBytes
	if v := r.URL.Query().Get(protocol.QueryMaxBytes); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n > limit {
			return 0, fmt.Errorf("%s must be 1-%d", protocol.QueryMaxBytes, limit)
		}
		limit = n
	}
	return limit, nil
}

// holdWait is how long a snapshot or a restore waits for a run, a shell
// command or a file write under way to end before it is refused: a caller
// that snapshots right after its run must not be told the sandbox is busy.
const holdWait = 3 * time.Second

// hold reserves the session's worker for a snapshot or a restore, as a run
// would, waiting up to holdWait for one under way; seal also refuses every
// later run until unsealed or reset.
func (s *Server) hold(session string, seal bool) (*worker, error) {
	deadline := time.Now().Add(holdWait)
	for {
		wk, err := s.tryHold(session, seal)
		var ae *apiError
		if err == nil || !errors.As(err, &ae) || ae.code != http.StatusConflict || time.Now().After(deadline) {
			return wk, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *Server) tryHold(session string, seal bool) (*worker, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sealed && !seal {
		return nil, errSealed
	}
	var wk *worker
	if i, ok := s.sessions[session]; ok && session != "" {
		wk = s.workers[i]
	} else if session != "" {
		return nil, &apiError{http.StatusNotFound, fmt.Sprintf("no session %q: it has not run anything since the agent started or it was reset", session)}
	} else {
		for _, w := range s.workers {
			if w.session == "" {
				wk = w
				break
			}
		}
	}
	switch {
	case wk == nil:
		return nil, &apiError{http.StatusConflict, "all interpreters are bound to sessions: name one with ?session="}
	case wk.busy || s.shells.Load() > 0 || s.writes.Load() > 0:
		return nil, &apiError{http.StatusConflict, "an execution, shell command or file write is under way: snapshot once it ends"}
	}
	wk.busy, wk.snapshotting = true, !seal
	if seal {
		s.sealed = true
	}
	return wk, nil
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := s.maxSnapshotBytes(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	seal := q.Get(protocol.QuerySeal) == "true"
	wk, err := s.hold(q.Get("session"), seal)
	if err != nil {
		writeError(w, errorCode(err, http.StatusConflict), err.Error())
		return
	}
	// The interpreter and the workspace are held until their bytes are in
	// the snapshot's files, not while they are sent: a run waits for the
	// pickling, never for the caller reading.
	var once sync.Once
	release := func() { once.Do(func() { s.release(wk) }) }
	defer release()
	runs := s.runs.Load() // every run started has ended: the worker is held
	root, done, err := s.scratch()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	defer done()
	saved, err := wk.interp.Snapshot(root.Name()+"/namespace", limit)
	var tooLarge *interpreter.TooLargeError
	switch {
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, err.Error())
		return
	case errors.Is(err, interpreter.ErrBusy):
		writeError(w, http.StatusConflict, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	m := &snapshot.Manifest{Format: 1, Created: time.Now().UTC(), Python: saved.Python, Serializer: saved.Serializer,
		Compression: saved.Compression, Variables: saved.Variables, Modules: saved.Modules, Skipped: saved.Skipped, Runs: runs}
	files := []string{"namespace"}
	if q.Get(protocol.QueryWorkspace) == "true" {
		f, err := root.Create("workspace")
		if err != nil {
			writeError(w, http.StatusInternalServerError, "write the workspace's archive: "+err.Error())
			return
		}
		n, size, _, err := s.cfg.Workspace.Archive(f, limit-saved.Bytes)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, workspace.ErrTooLarge) {
				code = http.StatusRequestEntityTooLarge
				err = fmt.Errorf("%w; leave the workspace out (%s=false) or delete large files", err, protocol.QueryWorkspace)
			}
			writeError(w, code, err.Error())
			return
		}
		m.Workspace = &snapshot.Workspace{Files: n, Bytes: size}
		files = append(files, "workspace")
	}
	for i, name := range files {
		f, err := root.Open(name)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "read the snapshot back: "+err.Error())
			return
		}
		sec, err := snapshot.Hashed([]string{snapshot.SectionNamespace, snapshot.SectionWorkspace}[i], f)
		_ = f.Close()
		if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		m.Sections = append(m.Sections, sec)
	}
	if size := m.Size(); size > limit {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the snapshot is %d bytes, more than the limit of %d", size, limit))
		return
	}
	release()
	w.Header().Set("Content-Type", snapshot.MediaType)
	w.Header().Set("Content-Length", strconv.FormatInt(m.Size(), 10))
	w.WriteHeader(http.StatusOK)
	if err := snapshot.WriteHeader(w, m); err != nil {
		return
	}
	for i, name := range files {
		f, err := root.Open(name)
		if err != nil {
			return // the caller sees a short body, which the section hashes catch
		}
		_, err = io.CopyN(w, f, m.Sections[i].Bytes)
		_ = f.Close()
		if err != nil {
			return
		}
	}
}

func (s *Server) restore(w http.ResponseWriter, r *http.Request) {
	limit, err := s.maxSnapshotBytes(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var runs int64
	if v := r.URL.Query().Get(protocol.QueryRuns); v != "" {
		if runs, err = strconv.ParseInt(v, 10, 64); err != nil || runs < 0 {
			writeError(w, http.StatusBadRequest, protocol.QueryRuns+" must be a number of runs, 0 or more")
			return
		}
	}
	var moved *protocol.Moved
	if v := r.URL.Query().Get(protocol.QueryMoved); v != "" {
		moved = &protocol.Moved{}
		if len(v) > protocol.MaxMovedBytes || json.Unmarshal([]byte(v), moved) != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("%s: a JSON object of at most %d bytes", protocol.QueryMoved, protocol.MaxMovedBytes))
			return
		}
	}
	if r.URL.Query().Get(protocol.QueryUnseal) == "true" {
		s.mu.Lock()
		s.sealed = false
		s.mu.Unlock()
	}
	session := r.URL.Query().Get("session")
	var wk *worker
	if session != "" {
		// A restore binds the session as its first run would.
		var reset bool
		if wk, reset, err = s.acquire(session, true); err == nil && reset {
			if rerr := wk.interp.Reset(); rerr != nil {
				s.release(wk)
				err = &apiError{http.StatusServiceUnavailable, "a fresh interpreter for the session: " + rerr.Error()}
			}
		}
	} else {
		wk, err = s.hold("", false)
	}
	if errors.Is(err, errSealed) {
		writeSealed(w)
		return
	}
	if err != nil {
		writeError(w, errorCode(err, http.StatusConflict), err.Error())
		return
	}
	defer s.release(wk)
	body := http.MaxBytesReader(w, r.Body, limit+snapshot.MaxManifestBytes+64)
	m, err := snapshot.ReadHeader(body)
	if err == nil {
		err = m.Validate(limit)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "not a snapshot this agent can restore: "+err.Error())
		return
	}
	root, done, err := s.scratch()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	defer done()
	for _, sec := range m.Sections {
		f, err := root.Create(sec.Name)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "write the snapshot: "+err.Error())
			return
		}
		_, err = io.Copy(f, snapshot.SectionReader(body, sec))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the snapshot is larger than the limit of %d bytes", limit))
				return
			}
			writeError(w, http.StatusBadRequest, "the snapshot's bytes are not what its manifest says: "+err.Error())
			return
		}
	}
	res := protocol.Restored{}
	if sec, ok := m.Section(snapshot.SectionWorkspace); ok && sec.Bytes > 0 {
		f, err := root.Open(snapshot.SectionWorkspace)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "read the snapshot's workspace: "+err.Error())
			return
		}
		res.WorkspaceFiles, err = s.cfg.Workspace.Extract(f, limit)
		_ = f.Close()
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	loaded, err := wk.interp.Restore(root.Name()+"/"+snapshot.SectionNamespace, m)
	var version *interpreter.VersionError
	switch {
	case errors.As(err, &version):
		writeError(w, http.StatusUnprocessableEntity, err.Error())
		return
	case errors.Is(err, interpreter.ErrBusy):
		writeError(w, http.StatusConflict, err.Error())
		return
	case err != nil:
		// The namespace's own code failed (or was a hostile pickle): the
		// interpreter says what, and its state is what the load left.
		writeError(w, http.StatusUnprocessableEntity, err.Error())
		return
	}
	res.Variables, res.ModulesFailed = loaded.Variables, loaded.ModulesFailed
	// Said by the next run; a restore that is not a move clears an older one.
	s.mu.Lock()
	s.moved = moved
	s.mu.Unlock()
	if runs > s.runs.Load() { // the run count goes on from the restored state's
		s.runs.Store(runs)
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) unseal(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	s.sealed = false
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]bool{"sealed": false})
}
