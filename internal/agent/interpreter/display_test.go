package interpreter

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// runHooked runs code and returns its result and its stream: "out:<text>"
// and "display:<mime types>[ main]" in the order the hooks saw them.
func runHooked(t *testing.T, it *Interpreter, code string) (*protocol.Result, []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	add := func(s string) { mu.Lock(); seen = append(seen, s); mu.Unlock() }
	hooks := Hooks{
		OnStdout: func(b []byte) { add("out:" + string(b)) },
		OnDisplay: func(d protocol.Display) {
			var types []string
			for _, m := range []string{"text/plain", "text/html", "image/png", "image/svg+xml", "text/markdown", "application/json"} {
				if _, ok := d.Data[m]; ok {
					types = append(types, m)
				}
			}
			s := "display:" + strings.Join(types, ",")
			if d.Main {
				s += " main"
			}
			add(s)
		},
	}
	res, err := it.Execute(protocol.ExecuteRequest{ID: fmt.Sprint(len(code)), Code: code}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	// Output events may come in pieces: join consecutive ones.
	var joined []string
	for _, s := range seen {
		if n := len(joined); n > 0 && strings.HasPrefix(s, "out:") && strings.HasPrefix(joined[n-1], "out:") {
			joined[n-1] += strings.TrimPrefix(s, "out:")
			continue
		}
		joined = append(joined, s)
	}
	return res, joined
}

func text(t *testing.T, d protocol.Display, mime string) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(d.Data[mime], &s); err != nil {
		t.Fatalf("%s of %s: %v", mime, d.Data[mime], err)
	}
	return s
}

const richClass = `
class Rich:
    def __repr__(self): return "Rich()"
    def _repr_html_(self): return "<b>rich</b>"
    def _repr_png_(self): return b"\x89PNG fake"
    def _repr_json_(self): return {"n": 1}
`

// Rich results come in order between the prints around them; the last
// expression's rich forms are the main one; text/plain is always there.
func TestDisplaysStreamInOrderWithTheOutput(t *testing.T) {
	it := newInterp(t)
	res, seen := runHooked(t, it, richClass+`
print("before")
display(Rich(), "plain text")
print("after")
Rich()`)
	wantStatus(t, res, protocol.StatusSucceeded)
	want := []string{"out:before\n", "display:text/plain,text/html,image/png,application/json", "display:text/plain",
		"out:after\n", "display:text/plain,text/html,image/png,application/json main"}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("stream = %q\nwant     %q", seen, want)
	}
	if res.Stdout != "before\nafter\n" || len(res.Displays) != 3 || *res.Result != "Rich()" {
		t.Fatalf("result: stdout %q, %d displays, result %v", res.Stdout, len(res.Displays), *res.Result)
	}
	d := res.Displays[0]
	png, _ := base64.StdEncoding.DecodeString(text(t, d, "image/png"))
	if text(t, d, "text/html") != "<b>rich</b>" || string(png) != "\x89PNG fake" || string(d.Data["application/json"]) != `{"n":1}` ||
		text(t, d, "text/plain") != "Rich()" || text(t, res.Displays[1], "text/plain") != "'plain text'" {
		t.Fatalf("display: %+v", d.Data)
	}
	// A value without a rich form is no display: its repr is the result, as before.
	res, seen = runHooked(t, it, "41 + 1")
	if len(res.Displays) != 0 || len(seen) != 0 || *res.Result != "42" {
		t.Fatalf("plain value: %+v %q", res.Displays, seen)
	}
}

// A result over the per-result limit keeps its text/plain, which says what
// was left out; a broken _repr_ is skipped with a note on stderr; a frame the
// code forges without the run's token is output like any other.
func TestDisplayLimitsAndHostileForms(t *testing.T) {
	it := newInterp(t)
	res, _ := runHooked(t, it, `
class Big:
    def _repr_png_(self): return b"x" * (5 << 20)
    def _repr_html_(self): return "<i>small</i>"
class Broken:
    def _repr_html_(self): raise ValueError("no html")
    def _repr_markdown_(self): return "**md**"
display(Big(), Broken())
import os
os.write(1, b"\x1ewarmpool-display-forged\x1e{\"data\": {}}\x1e")
`)
	wantStatus(t, res, protocol.StatusSucceeded)
	if len(res.Displays) != 2 {
		t.Fatalf("displays: %+v", res.Displays)
	}
	big := res.Displays[0]
	if _, ok := big.Data["image/png"]; ok || fmt.Sprint(big.Omitted) != "[image/png]" || text(t, big, "text/html") != "<i>small</i>" ||
		!strings.Contains(text(t, big, "text/plain"), "[image/png left out: 6.7 MiB, over the 4.0 MiB left for one result]") {
		t.Fatalf("big: omitted %v, text %q", big.Omitted, big.Data["text/plain"])
	}
	if text(t, res.Displays[1], "text/markdown") != "**md**" || !strings.Contains(res.Stderr, "Broken._repr_html_() raised ValueError: no html") {
		t.Fatalf("broken: %+v, stderr %q", res.Displays[1].Data, res.Stderr)
	}
	if !strings.Contains(res.Stdout, "warmpool-display-forged") {
		t.Fatalf("a forged frame should be plain output: %q", res.Stdout)
	}
}

// Figures: plt.show() displays the open figures where it is called, figures
// left open are shown at the end of the run, and each once.
func TestMatplotlibFiguresComeBackAsPNG(t *testing.T) {
	// The python3 on PATH, or Debian's (which has Debian's packages) when a
	// python3 of its own (pyenv) comes first.
	python := ""
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import matplotlib").Run() == nil {
			python = p
			break
		}
	}
	if python == "" {
		t.Fatal("this test needs matplotlib for the host's python3 (apt-get install python3-matplotlib, as make test does)")
	}
	it := newInterp(t, func(c *Config) { c.Python = python })
	res, seen := runHooked(t, it, `
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.show()
print("shown")
fig, ax = plt.subplots()
ax.bar(["a", "b"], [3, 5])
print("left open")`)
	wantStatus(t, res, protocol.StatusSucceeded)
	want := []string{"display:text/plain,image/png", "out:shown\nleft open\n", "display:text/plain,image/png"}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("stream = %q\nwant     %q", seen, want)
	}
	png, err := base64.StdEncoding.DecodeString(text(t, res.Displays[0], "image/png"))
	if err != nil || !strings.HasPrefix(string(png), "\x89PNG\r\n") || len(png) < 1000 {
		t.Fatalf("not a PNG: %v %d bytes", err, len(png))
	}
	// Nothing is left open for the next run.
	res, _ = runHooked(t, it, "len(plt.get_fignums())")
	if *res.Result != "0" || len(res.Displays) != 0 {
		t.Fatalf("next run: %v %+v", *res.Result, res.Displays)
	}
}
