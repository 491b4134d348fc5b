// Command helmchart writes the Helm chart charts/warmpool from the kustomize
// builds that `make deploy` applies (config/default, config/runtimeclass,
// config/apiservice, config/admission) and the opt-in config/prometheus and config/guardrails,
// so that the chart and the manifests cannot drift: every object of the chart
// is a kustomize object with Helm's labels added and a few fields turned into
// values, and with default values the chart renders exactly what kustomize
// builds (make helm-check proves it). `make helm` runs it; `make verify` fails
// when the committed chart differs from what it writes.
//
// The layout follows kubebuilder's helm plugin: templates/crd (the CRDs under
// templates, so upgrades apply them), templates/rbac, templates/manager,
// templates/metrics, templates/prometheus, and templates/dataplane,
// templates/runtimeclass, templates/admission and templates/guardrails for what is warmpool's own.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"

	"go.yaml.in/yaml/v3"
)

// The kustomize directories the chart is made of, under -config: what `make
// deploy` applies, in its order, then the opt-in ones (the Prometheus
// Operator's objects, the guard rails).
var sources = []string{"default", "runtimeclass", "apiservice", "admission", "prometheus", "guardrails"}

func main() {
	kustomize := flag.String("kustomize", "bin/kustomize", "the kustomize binary")
	config := flag.String("config", "config", "the kustomize tree")
	out := flag.String("out", "charts/warmpool", "the chart's directory; everything in it is replaced")
	version := flag.String("version", "0.1.0", "the chart's version (SemVer)")
	flag.Parse()
	if err := run(*kustomize, *config, *out, *version); err != nil {
		fmt.Fprintln(os.Stderr, "helmchart:", err)
		os.Exit(1)
	}
}

func run(kustomize, config, out, version string) error {
	builds := map[string][]*yaml.Node{}
	for _, dir := range sources {
		docs, err := build(kustomize, filepath.Join(config, dir))
		if err != nil {
			return err
		}
		builds[dir] = docs
	}
	files, err := Chart(builds, version)
	if err != nil {
		return err
	}
	// The chart is generated whole: a file of an object that left config/
	// must not linger.
	if err := os.RemoveAll(out); err != nil {
		return fmt.Errorf("clear %s: %w", out, err)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		path := filepath.Join(out, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		if err := os.WriteFile(path, files[name], 0o644); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}

// build runs `kustomize build dir` and returns its objects' documents.
func build(kustomize, dir string) ([]*yaml.Node, error) {
	cmd := exec.Command(kustomize, "build", dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w\n%s", dir, err, stderr.String())
	}
	docs, err := decodeAll(stdout.Bytes())
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return docs, nil
}

// decodeAll returns the mapping node of every non-empty document in b.
func decodeAll(b []byte) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var docs []*yaml.Node
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if err == io.EOF {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(doc.Content) == 0 {
			continue
		}
		if doc.Content[0].Kind != yaml.MappingNode {
			return nil, fmt.Errorf("a document that is not an object (line %d)", doc.Line)
		}
		docs = append(docs, doc.Content[0])
	}
}
