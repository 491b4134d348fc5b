package controller_test

import (
	"io"
	"net"
	"net/url"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// The manager of the suite reaches agents through proxiedResolver: the test
// kubelet's addresses, except for the namespaces a spec routes through a
// proxy whose connections it can cut, as a network fault between the
// manager and a pod would.
type proxiedResolver struct{}

var (
	proxiesMu sync.Mutex
	proxies   = map[string]*agentProxy{} // by namespace
)

func (proxiedResolver) Address(pod *corev1.Pod) (string, error) {
	addr, err := kubelet.Address(pod)
	if err != nil {
		return "", err
	}
	proxiesMu.Lock()
	p := proxies[pod.Namespace]
	proxiesMu.Unlock()
	if p == nil {
		return addr, nil
	}
	return p.to(addr)
}

// agentProxy forwards TCP connections to agents, one listener per agent.
type agentProxy struct {
	mu        sync.Mutex
	listeners map[string]net.Listener // by agent host:port
	conns     map[net.Conn]bool
}

// proxyNamespace routes the manager's calls to the agents of ns through a
// proxy, until the spec ends.
func proxyNamespace(ns string) *agentProxy {
	p := &agentProxy{listeners: map[string]net.Listener{}, conns: map[net.Conn]bool{}}
	proxiesMu.Lock()
	proxies[ns] = p
	proxiesMu.Unlock()
	return p
}

func (p *agentProxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.listeners {
		_ = l.Close()
	}
}

// to returns the proxy's address for an agent's http://host:port.
func (p *agentProxy) to(agent string) (string, error) {
	u, err := url.Parse(agent)
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if l, ok := p.listeners[u.Host]; ok {
		return "http://" + l.Addr().String(), nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	p.listeners[u.Host] = l
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.forward(c, u.Host)
		}
	}()
	return "http://" + l.Addr().String(), nil
}

func (p *agentProxy) forward(c net.Conn, target string) {
	up, err := net.Dial("tcp", target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
	_, _ = io.Copy(c, up)
	_ = c.Close()
}

// reset cuts every connection open through the proxy with a TCP reset.
// New connections go through.
func (p *agentProxy) reset() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
		delete(p.conns, c)
		n++
	}
	return n
}
