package harness

import (
	"fmt"
	"io"
	"sync"
)

// Program lets a program that is not a test (the demo) use the harness:
// it implements TB, runs cleanups in reverse order when the program's body
// returns, and turns Fatalf into an orderly exit through those cleanups.
type Program struct {
	name string
	out  io.Writer

	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

type programExit struct{}

// RunProgram runs body with a Program and returns the exit code: 0, or 1
// after Fatalf (or Skipf, which a program cannot honour) or a failure.
func RunProgram(name string, out io.Writer, body func(p *Program)) (code int) {
	p := &Program{name: name, out: out}
	defer func() {
		r := recover()
		if _, ok := r.(programExit); r != nil && !ok {
			p.runCleanups()
			panic(r)
		}
		p.runCleanups()
		if p.Failed() {
			code = 1
		}
	}()
	body(p)
	return 0
}

func (p *Program) runCleanups() {
	for {
		p.mu.Lock()
		if len(p.cleanups) == 0 {
			p.mu.Unlock()
			return
		}
		f := p.cleanups[len(p.cleanups)-1]
		p.cleanups = p.cleanups[:len(p.cleanups)-1]
		p.mu.Unlock()
		f()
	}
}

func (p *Program) Helper()      {}
func (p *Program) Name() string { return p.name }
func (p *Program) Logf(format string, args ...any) {
	fmt.Fprintf(p.out, format+"\n", args...)
}
func (p *Program) Fatalf(format string, args ...any) {
	p.mu.Lock()
	p.failed = true
	p.mu.Unlock()
	fmt.Fprintf(p.out, "error: "+format+"\n", args...)
	panic(programExit{})
}
func (p *Program) Skipf(format string, args ...any) { p.Fatalf(format, args...) }
func (p *Program) Cleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, f)
}
func (p *Program) Failed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}
