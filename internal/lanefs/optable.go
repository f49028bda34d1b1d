package lanefs

import (
	"context"
	"fmt"
	"reflect"
	"sync"
)

// An Op is one operation of the file helper: its name on the wire, its
// request and answer types, the server's handler, and what the harness
// API says of it. Ops holds every one; the server dispatches from it, a
// Go caller calls by it (Typed.Call), and the controller makes its file
// routes, and their OpenAPI document, from it. Adding an operation is one
// row below, with its types and handler.
type Op struct {
	Name string
	// Summary says what it does, for the API's document.
	Summary string
	// Required are the request fields a caller must give.
	Required []string
	// Changes: it may change files. The client counts it (Changes), and
	// the API's read-only research routes leave it out.
	Changes bool

	request, response reflect.Type
	// root and path are the indexes of the request's Root and Path fields.
	root, path int
	newRequest func() any
	// serve runs the handler on a request newRequest made.
	serve func(s *Server, req any) (any, *Error)
}

// Ops are the helper's operations, in the order of the rows below (the
// order of the API's routes).
var Ops []*Op

// The operations, each one row. A row's var is what a Go caller calls it
// by: Read.Call(ctx, client, ReadRequest{...}).
var (
	Read = define((*Server).read, Op{Name: "read", Required: []string{"path"},
		Summary: "Read a file's bytes (base64), from offset, at most limit"})
	Write = define((*Server).write, Op{Name: "write", Required: []string{"path", "data"}, Changes: true,
		Summary: "Write a file (data base64), creating it or replacing its content"})
	Edit = define((*Server).edit, Op{Name: "edit", Required: []string{"path", "old"}, Changes: true,
		Summary: "Replace the one place old occurs in a file by new"})
	List = define((*Server).list, Op{Name: "list",
		Summary: "List a folder"})
	Stat = define((*Server).stat, Op{Name: "stat", Required: []string{"path"},
		Summary: "Describe one file, folder or symlink"})
	Delete = define((*Server).delete, Op{Name: "delete", Required: []string{"path"}, Changes: true,
		Summary: "Delete a file, a symlink, or a folder (recursive for one with content)"})
	Mkdir = define((*Server).mkdir, Op{Name: "mkdir", Required: []string{"path"}, Changes: true,
		Summary: "Make a folder"})
	Grep = define((*Server).grep, Op{Name: "grep", Required: []string{"pattern"},
		Summary: "Search files under a folder for a regular expression"})
	Find = define((*Server).find, Op{Name: "find",
		Summary: "Find files under a folder whose names match a glob"})
)

// opsByName is Ops by name, for the server's dispatch, made on first use:
// every thermite process links this package, few serve it.
var opsByName = sync.OnceValue(func() map[string]*Op {
	m := make(map[string]*Op, len(Ops))
	for _, o := range Ops {
		if m[o.Name] != nil {
			panic("lanefs: two operations named " + o.Name)
		}
		m[o.Name] = o
	}
	return m
})

// OpNamed is the operation of that name, or nil.
func OpNamed(name string) *Op { return opsByName()[name] }

// Typed is an operation with its request and answer types.
type Typed[Req, Resp any] struct{ *Op }

// Call runs the operation on the helper c talks to.
func (t Typed[Req, Resp]) Call(ctx context.Context, c *Client, req Req) (*Resp, error) {
	out := new(Resp)
	if err := c.Call(ctx, t.Op, &req, out); err != nil {
		return nil, err
	}
	return out, nil
}

// define adds the operation o, served by handle, to Ops. Its request type
// must have the fields every request has, Root and Path: the API pins
// them (Pin).
func define[Req, Resp any](handle func(*Server, *Req) (*Resp, *Error), o Op) Typed[Req, Resp] {
	o.request, o.response = reflect.TypeFor[Req](), reflect.TypeFor[Resp]()
	o.root, o.path = field(o.request, "Root", reflect.Int), field(o.request, "Path", reflect.String)
	o.newRequest = func() any { return new(Req) }
	o.serve = func(s *Server, req any) (any, *Error) {
		resp, e := handle(s, req.(*Req))
		if e != nil {
			return nil, e
		}
		return resp, nil
	}
	Ops = append(Ops, &o)
	return Typed[Req, Resp]{&o}
}

// field is the index of t's field name of kind k; a request type without
// it is a mistake in the table, found as the package starts.
func field(t reflect.Type, name string, k reflect.Kind) int {
	f, ok := t.FieldByName(name)
	if !ok || len(f.Index) != 1 || f.Type.Kind() != k {
		panic(fmt.Sprintf("lanefs: %s has no %s field of kind %s", t, name, k))
	}
	return f.Index[0]
}

// NewRequest is a new request of the operation's type, to decode into.
func (o *Op) NewRequest() any { return o.newRequest() }

// NewResponse is a new answer of the operation's type, to decode into.
func (o *Op) NewResponse() any { return reflect.New(o.response).Interface() }

// Response is the zero answer of the operation's type (not a pointer),
// for a document to describe.
func (o *Op) Response() any { return reflect.Zero(o.response).Interface() }

// Pin sets the root folder of req, a request NewRequest made, and passes
// its path through path: the API chooses the root, never its caller.
func (o *Op) Pin(req any, root int, path func(string) string) {
	v := reflect.ValueOf(req).Elem()
	v.Field(o.root).SetInt(int64(root))
	p := v.Field(o.path)
	p.SetString(path(p.String()))
}
