package server

import (
	"errors"
	"io"
	"io/fs"
	"net/http"

	"github.com/warmpool/warmpool/internal/agent/workspace"
)

// fileError maps workspace errors to a status a caller can act on.
func fileError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, workspace.ErrEscape):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, fs.ErrNotExist):
		writeError(w, http.StatusNotFound, "no such file or directory in the workspace")
	default:
		writeError(w, http.StatusBadRequest, err.Error())
	}
}

func (s *Server) fileRead(w http.ResponseWriter, r *http.Request) {
	f, err := s.cfg.Workspace.Read(r.URL.Query().Get("path"))
	if err != nil {
		fileError(w, err)
		return
	}
	defer func() { _ = f.Close() }()
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		writeError(w, http.StatusBadRequest, "path is a directory: use "+"/v1/files/list")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = io.Copy(w, f)
}

func (s *Server) fileWrite(w http.ResponseWriter, r *http.Request) {
	s.writes.Add(1)
	defer s.ended(&s.writes)
	if s.isSealed() {
		writeSealed(w)
		return
	}
	n, err := s.cfg.Workspace.Write(r.URL.Query().Get("path"), r.Body, s.cfg.MaxFileBytes)
	if err != nil {
		fileError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"bytes": n})
}

func (s *Server) fileList(w http.ResponseWriter, r *http.Request) {
	list, err := s.cfg.Workspace.List(r.URL.Query().Get("path"))
	if err != nil {
		fileError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) fileStat(w http.ResponseWriter, r *http.Request) {
	fi, err := s.cfg.Workspace.Stat(r.URL.Query().Get("path"))
	if err != nil {
		fileError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}
