package main

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// A templater turns one kustomize object into a Helm template. Helm's
// conditionals and toYaml blocks are not YAML, so the object is edited as a
// YAML tree in which marker scalars stand for template text, encoded, and the
// markers are then replaced: an inline marker by its text where it stands, a
// block marker (a mapping key or a sequence item of its own) by whole lines at
// its indentation.
type templater struct {
	inline map[string]string
	blocks map[string]func(indent int) []string
}

// markers are unique in the whole chart, so a marker can never be taken for
// another object's.
var (
	markers  int
	markerRE = regexp.MustCompile(`HELMCHARTMARK[0-9]+X`)
)

func newTemplater() *templater {
	return &templater{inline: map[string]string{}, blocks: map[string]func(int) []string{}}
}

func nextMarker() string {
	markers++
	return "HELMCHARTMARK" + strconv.Itoa(markers) + "X"
}

// value is a scalar node rendered as the template text tpl.
func (t *templater) value(tpl string) *yaml.Node {
	m := nextMarker()
	t.inline[m] = tpl
	return str(m)
}

// block is a node that, as a sequence item or as a mapping key (with a null
// value), is replaced by the lines f returns, each indented by the column the
// item's dash or the key starts at; f gets that column for nindent.
func (t *templater) block(f func(indent int) []string) *yaml.Node {
	m := nextMarker()
	t.blocks[m] = f
	return str(m)
}

// render encodes n and replaces its markers. Text that kustomize's objects
// carry verbatim (Prometheus rules' {{ $labels }}) is escaped first, so Helm
// prints it as it is.
func (t *templater) render(n *yaml.Node) (string, error) {
	text, err := encode(n)
	if err != nil {
		return "", err
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		m := markerRE.FindString(line)
		if m == "" {
			out = append(out, line)
			continue
		}
		if f, ok := t.blocks[m]; ok {
			rest := strings.TrimLeft(line, " ")
			indent := len(line) - len(rest)
			if rest != m+": null" && rest != "- "+m {
				return "", fmt.Errorf("block %s is not a key or an item of its own: %q", m, line)
			}
			for _, l := range f(indent) {
				out = append(out, strings.Repeat(" ", indent)+l)
			}
			continue
		}
		line = markerRE.ReplaceAllStringFunc(line, func(m string) string {
			if tpl, ok := t.inline[m]; ok {
				return tpl
			}
			err = fmt.Errorf("marker %s of another object", m)
			return m
		})
		if err != nil {
			return "", err
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n") + "\n", nil
}

// encode writes n as YAML, escaped for Go templates.
func encode(n *yaml.Node) (string, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(n); err != nil {
		return "", err
	}
	if err := enc.Close(); err != nil {
		return "", err
	}
	return strings.ReplaceAll(b.String(), "{{", `{{ "{{" }}`), nil
}

// itemLines are the lines of a sequence holding only n ("- ..."), escaped.
func itemLines(n *yaml.Node) []string {
	text, err := encode(&yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: []*yaml.Node{n}})
	if err != nil {
		// Nodes decoded from kustomize's output always encode.
		panic(err)
	}
	return strings.Split(strings.TrimSuffix(text, "\n"), "\n")
}

// ifItems renders the sequence items when cond holds.
func ifItems(cond string, items ...*yaml.Node) func(int) []string {
	return func(int) []string {
		lines := []string{"{{- if " + cond + " }}"}
		for _, n := range items {
			lines = append(lines, itemLines(n)...)
		}
		return append(lines, "{{- end }}")
	}
}

// toYamlItems renders the list expr, if any, as more items of the sequence.
func toYamlItems(expr string) func(int) []string {
	return func(indent int) []string {
		return []string{
			"{{- with " + expr + " }}",
			fmt.Sprintf("{{- toYaml . | nindent %d }}", indent),
			"{{- end }}",
		}
	}
}

// withKey renders key: expr when expr is not empty.
func withKey(key, expr string) func(int) []string {
	return func(indent int) []string {
		return []string{
			"{{- with " + expr + " }}",
			key + ":",
			fmt.Sprintf("  {{- toYaml . | nindent %d }}", indent+2),
			"{{- end }}",
		}
	}
}

// YAML tree helpers. Objects are mappings; get follows keys and returns nil
// when one is missing.

func str(v string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v}
}

func null() *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
}

func mapping() *yaml.Node {
	return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
}

func get(n *yaml.Node, path ...string) *yaml.Node {
	for _, k := range path {
		if n == nil || n.Kind != yaml.MappingNode {
			return nil
		}
		i := keyIndex(n, k)
		if i < 0 {
			return nil
		}
		n = n.Content[i+1]
	}
	return n
}

func getString(n *yaml.Node, path ...string) string {
	if v := get(n, path...); v != nil && v.Kind == yaml.ScalarNode {
		return v.Value
	}
	return ""
}

func keyIndex(m *yaml.Node, key string) int {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return i
		}
	}
	return -1
}

// set replaces key's value, or adds key before the key named before (at
// the end when there is none).
func set(m *yaml.Node, key string, v *yaml.Node, before string) {
	if i := keyIndex(m, key); i >= 0 {
		m.Content[i+1] = v
		return
	}
	insertAt(m, keyIndex(m, before), str(key), v)
}

// insertAt puts the pair k, v at index i of m's content (at the end for -1).
func insertAt(m *yaml.Node, i int, k, v *yaml.Node) {
	if i < 0 {
		m.Content = append(m.Content, k, v)
		return
	}
	m.Content = append(m.Content[:i], append([]*yaml.Node{k, v}, m.Content[i:]...)...)
}

// appendBlock adds a block to a mapping (as a key) or a sequence (as an item).
func appendBlock(n, block *yaml.Node) {
	if n.Kind == yaml.MappingNode {
		n.Content = append(n.Content, block, null())
		return
	}
	n.Content = append(n.Content, block)
}

// replaceWithBlock puts a block in the place of key and its value.
func replaceWithBlock(m *yaml.Node, key string, block *yaml.Node) error {
	i := keyIndex(m, key)
	if i < 0 {
		return fmt.Errorf("no %s", key)
	}
	m.Content[i], m.Content[i+1] = block, null()
	return nil
}

func keys(m *yaml.Node) []string {
	var ks []string
	for i := 0; i+1 < len(m.Content); i += 2 {
		ks = append(ks, m.Content[i].Value)
	}
	return ks
}
