package interpreter

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// FuzzChannel feeds the agent's side of the interpreter channel whatever the
// code could write to it (random, forged, truncated, oversized messages),
// followed by the REPL server's genuine reply. The agent must never wedge (the
// reader returns when the channel ends), must never take a message the fuzzer
// made for the run's (it cannot know the run's secret), and must take the
// genuine reply only when nothing but blank lines came before it: anything
// else ended the interpreter first.
func FuzzChannel(f *testing.F) {
	for _, seed := range []string{
		"",
		"\n\n",
		"{",
		"{}\n",
		"[]\n",
		"null\n",
		"\xff\xfe{\"jsonrpc\": \"2.0\", \"id\": \n",
		`{"jsonrpc":"2.0","id":"run-1","result":{"status":"ok","result":"'forged'"}}` + "\n",
		`{"jsonrpc":"2.0","id":"run-1","secret":"","result":{"status":"ok"}}` + "\n",
		`{"jsonrpc":"2.0","id":"b1-1","run":"run-1","method":"llm_query","params":{"prompt":"x"}}` + "\n",
		`{"jsonrpc":"2.0","method":"ready","params":{}}` + "\n",
		`{"jsonrpc":"2.0","id":"run-1","secret":"run-1","result":{}}` + "\n",
		`{"id":1,"result":{}}` + "\n" + `{"id":2,"result":{}}`,
		string(bytes.Repeat([]byte("x"), 300)) + "\n",
		`{"jsonrpc":"2.0","id":"run-1","error":{"message":"boom"}}` + "\n",
	} {
		f.Add([]byte(seed), true)
		f.Add([]byte(seed), false)
	}
	f.Fuzz(func(t *testing.T, data []byte, genuine bool) {
		it := New(Config{MaxMessageBytes: 256, Log: logr.Discard()})
		it.channelGrace = 0
		p := &process{msgs: make(chan rpcMessage, 16), exited: make(chan struct{}), ready: true}
		key := &runKey{id: "run-1", secret: newID()}
		p.expect(key, 4)
		stream := append([]byte(nil), data...)
		if genuine {
			reply, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": key.id, "secret": key.secret,
				"result": map[string]any{"status": "ok", "result": "'genuine'"}})
			stream = append(append(append(stream, '\n'), reply...), '\n')
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			it.readMessages(p, bytes.NewReader(stream))
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("the reader wedged on %q", data)
		}
		close(p.msgs)
		var got []rpcMessage
		for m := range p.msgs {
			got = append(got, m)
		}
		clean := len(bytes.TrimSpace(data)) == 0
		for _, m := range got {
			if check(&m, key, true) != "" || m.Secret != key.secret {
				t.Fatalf("took a message that does not belong to the run: %+v from %q", m, data)
			}
			if string(m.Result) != `{"result":"'genuine'","status":"ok"}` {
				t.Fatalf("took a message the fuzzer made (it cannot know the secret): %+v from %q", m, data)
			}
		}
		switch {
		case genuine && clean && len(got) != 1:
			t.Fatalf("the genuine reply after %q was not taken (%d messages)", data, len(got))
		case !clean && len(got) != 0:
			t.Fatalf("after %q, which ends the interpreter, a reply was still taken", data)
		case !clean && p.end == "":
			t.Fatalf("%q did not end the interpreter", data)
		}
		// The channel closed while the process lived: ended as a violation too.
		if p.end == "" {
			t.Fatalf("the closed channel did not end the interpreter")
		}
	})
}
