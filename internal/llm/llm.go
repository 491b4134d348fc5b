// Package llm answers the llm_query and rlm_query calls of an Execution's
// code with an OpenAI-compatible chat-completions endpoint. The manager
// makes the call, not the sandbox: the sandbox's egress stays closed and the
// API key never enters it. Each run is held to the limits of its endpoint
// (calls, prompt bytes, completion tokens, time per call), and every call is
// counted in metrics.
package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// Endpoint is a resolved ModelEndpoint: where to ask, with what key, within what limits.
type Endpoint struct {
	// Name labels metrics and messages.
	Name   string
	URL    string
	Model  string
	APIKey string
	// MaxCallsPerRun bounds the calls of one run (the agent enforces it too).
	MaxCallsPerRun int
	// MaxPromptBytes bounds one call's prompt.
	MaxPromptBytes int
	// MaxTokens is sent as max_tokens: the most one completion may use.
	MaxTokens int
	// Timeout of one call.
	Timeout time.Duration
}

// maxResponseBytes bounds what is read of an endpoint's answer.
const maxResponseBytes = 4 << 20

// Client calls endpoints.
type Client struct {
	HTTP *http.Client
}

// NewClient returns a Client with its own transport.
func NewClient() *Client {
	return &Client{HTTP: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}}
}

// Usage is what the endpoint reported a call cost.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type chatRequest struct {
	Model     string        `json:"model"`
	Messages  []chatMessage `json:"messages"`
	MaxTokens int           `json:"max_tokens,omitempty"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatResponse struct {
	Choices []struct {
		Message      chatMessage `json:"message"`
		FinishReason string      `json:"finish_reason"`
	} `json:"choices"`
	Usage *Usage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// Complete asks ep for the completion of prompt as one user message.
func (c *Client) Complete(ctx context.Context, ep Endpoint, prompt string) (string, error) {
	if ep.MaxPromptBytes > 0 && len(prompt) > ep.MaxPromptBytes {
		metrics.LLMCalls.WithLabelValues(ep.Name, "refused").Inc()
		return "", fmt.Errorf("the prompt is %d bytes, over the %d bytes ModelEndpoint %s allows: send less text per call",
			len(prompt), ep.MaxPromptBytes, ep.Name)
	}
	if ep.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ep.Timeout)
		defer cancel()
	}
	body, _ := json.Marshal(chatRequest{Model: ep.Model, MaxTokens: ep.MaxTokens,
		Messages: []chatMessage{{Role: "user", Content: prompt}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL, bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("ModelEndpoint %s: %w", ep.Name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if ep.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+ep.APIKey)
	}
	start := time.Now()
	text, usage, err := c.do(req)
	metrics.LLMCallDuration.WithLabelValues(ep.Name).Observe(time.Since(start).Seconds())
	if err != nil {
		metrics.LLMCalls.WithLabelValues(ep.Name, "error").Inc()
		if errors.Is(err, context.DeadlineExceeded) && ep.Timeout > 0 {
			return "", fmt.Errorf("ModelEndpoint %s did not answer within %s", ep.Name, ep.Timeout)
		}
		return "", fmt.Errorf("ModelEndpoint %s: %w", ep.Name, err)
	}
	metrics.LLMCalls.WithLabelValues(ep.Name, "ok").Inc()
	if usage != nil {
		metrics.LLMTokens.WithLabelValues(ep.Name, "prompt").Add(float64(usage.PromptTokens))
		metrics.LLMTokens.WithLabelValues(ep.Name, "completion").Add(float64(usage.CompletionTokens))
	}
	return text, nil
}

func (c *Client) do(req *http.Request) (string, *Usage, error) {
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return "", nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return "", nil, fmt.Errorf("reading the answer: %w", err)
	}
	if len(data) > maxResponseBytes {
		return "", nil, fmt.Errorf("the answer is over %d bytes", maxResponseBytes)
	}
	var cr chatResponse
	jsonErr := json.Unmarshal(data, &cr)
	if resp.StatusCode/100 != 2 {
		msg := strings.TrimSpace(string(data))
		if jsonErr == nil && cr.Error != nil && cr.Error.Message != "" {
			msg = cr.Error.Message
		}
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		return "", nil, fmt.Errorf("answered %s: %s", resp.Status, msg)
	}
	if jsonErr != nil {
		return "", nil, fmt.Errorf("the answer is not a chat completion: %w", jsonErr)
	}
	if len(cr.Choices) == 0 {
		return "", cr.Usage, errors.New("the answer has no choices")
	}
	return cr.Choices[0].Message.Content, cr.Usage, nil
}

// Answerer answers the bridge calls of one run with ep; calls beyond
// ep.MaxCallsPerRun are refused (the agent refuses them first when it was
// given the same limit).
func (c *Client) Answerer(ep Endpoint) func(context.Context, protocol.BridgeCall) protocol.BridgeAnswer {
	var calls atomic.Int64
	return func(ctx context.Context, call protocol.BridgeCall) protocol.BridgeAnswer {
		prompts, batched, err := Prompts(call.Method, call.Params)
		if err != nil {
			return protocol.BridgeAnswer{Error: err.Error()}
		}
		// Each prompt of a batch is one model call against the limit.
		if ep.MaxCallsPerRun > 0 && calls.Add(int64(len(prompts))) > int64(ep.MaxCallsPerRun) {
			metrics.LLMCalls.WithLabelValues(ep.Name, "refused").Inc()
			return protocol.BridgeAnswer{Error: fmt.Sprintf("limit of %d model calls per run (ModelEndpoint %s) reached", ep.MaxCallsPerRun, ep.Name)}
		}
		texts := make([]string, len(prompts))
		errs := make([]error, len(prompts))
		var wg sync.WaitGroup
		sem := make(chan struct{}, maxConcurrentBatch)
		for i, prompt := range prompts {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				texts[i], errs[i] = c.Complete(ctx, ep, prompt)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return protocol.BridgeAnswer{Error: err.Error()}
		}
		var res []byte
		if batched {
			res, _ = json.Marshal(texts)
		} else {
			res, _ = json.Marshal(texts[0])
		}
		return protocol.BridgeAnswer{Result: res}
	}
}

// maxConcurrentBatch bounds the model calls of one batched query in flight.
const maxConcurrentBatch = 4

// Prompts are the prompts of a bridge call, one per model call: one for
// llm_query and rlm_query, one per item for their batched forms (batched
// is then true, and the answer is a list in the same order).
func Prompts(method string, params json.RawMessage) (prompts []string, batched bool, err error) {
	switch method {
	case "llm_query_batched":
		var p struct {
			Prompts []string `json:"prompts"`
		}
		if err := json.Unmarshal(params, &p); err != nil {
			return nil, true, fmt.Errorf("%s: unreadable parameters: %w", method, err)
		}
		return p.Prompts, true, nil
	case "rlm_query_batched":
		var p struct {
			Tasks []json.RawMessage `json:"tasks"`
		}
		if err := json.Unmarshal(params, &p); err != nil {
			return nil, true, fmt.Errorf("%s: unreadable parameters: %w", method, err)
		}
		for _, t := range p.Tasks {
			prompt, err := Prompt("rlm_query", t)
			if err != nil {
				return nil, true, err
			}
			prompts = append(prompts, prompt)
		}
		return prompts, true, nil
	}
	prompt, err := Prompt(method, params)
	if err != nil {
		return nil, false, err
	}
	return []string{prompt}, false, nil
}

// Prompt is the prompt of a bridge call for a model that answers it in one
// completion: llm_query's own, or for rlm_query (a recursive sub-task, which
// nobody runs here) its task, each followed by the context the code gave.
func Prompt(method string, params json.RawMessage) (string, error) {
	var p struct {
		Prompt  string          `json:"prompt"`
		Task    string          `json:"task"`
		Context json.RawMessage `json:"context"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return "", fmt.Errorf("%s: unreadable parameters: %w", method, err)
	}
	switch method {
	case "llm_query":
		return withContext(p.Prompt, p.Context), nil
	case "rlm_query":
		return withContext(p.Task, p.Context), nil
	}
	return "", fmt.Errorf("%s is not a model call", method)
}

// withContext appends a call's context to its prompt: a string as it is,
// anything else as JSON.
func withContext(prompt string, ctx json.RawMessage) string {
	if len(ctx) == 0 || string(ctx) == "null" {
		return prompt
	}
	var s string
	if json.Unmarshal(ctx, &s) == nil {
		return prompt + "\n\nContext:\n" + s
	}
	return prompt + "\n\nContext:\n" + string(ctx)
}
