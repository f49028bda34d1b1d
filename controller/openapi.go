package controller

import (
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"thermite/internal/lanefs"
)

// problemCodes are every code a problem of the harness API may carry.
var problemCodes = []string{
	CodeBadJSON, CodeUnknownField, CodeBadField, CodeMissingField, CodeUnauthorized, CodeForbidden,
	CodeDecoySeen, CodeNoRoute, CodeMethodNotAllowed, CodeBodyTimeout, CodeConflict, CodeTooLarge,
	CodeUnprocessable, CodeTooManyRequests, CodeBusy, CodeInternal, CodeBadGateway, CodeTimeout, CodeFetchRefused, CodeEgressRefused,
	lanefs.CodeEscape, lanefs.CodeDenied, lanefs.CodeNotFound, lanefs.CodeExists, lanefs.CodeBadRequest, lanefs.CodeIO,
}

// OpenAPIJSON is the harness API's OpenAPI 3.1 document as JSON.
func OpenAPIJSON() []byte { return openAPIDocument() }

// openAPIDocument is the harness API's OpenAPI 3.1 document, made from
// apiTable: what GET /v1/openapi.json answers and docs/openapi.json holds.
func openAPIDocument() []byte {
	openAPIOnce.Do(func() {
		b, err := json.MarshalIndent(OpenAPI(), "", "  ")
		if err != nil {
			panic(err)
		}
		openAPIBytes = append(b, '\n')
	})
	return openAPIBytes
}

var (
	openAPIOnce  sync.Once
	openAPIBytes []byte
)

// OpenAPI makes the document from the route table.
func OpenAPI() map[string]any {
	g := &schemaGen{schemas: map[string]any{}}
	codes := slices.Clone(problemCodes)
	slices.Sort(codes)
	codes = slices.Compact(codes)
	g.schemas["Problem"] = map[string]any{
		"type":        "object",
		"description": "An RFC 9457 problem: every error answer, as application/problem+json.",
		"required":    []string{"type", "title", "status", "detail", "code"},
		"properties": map[string]any{
			"type":   map[string]any{"type": "string", "description": "urn:thermite:problem: and the code"},
			"title":  map[string]any{"type": "string", "description": "the status's name"},
			"status": map[string]any{"type": "integer"},
			"detail": map[string]any{"type": "string", "description": "one line for a person"},
			"code":   map[string]any{"type": "string", "enum": codes, "description": "stable and machine-readable"},
		},
	}
	problem := func(status int) map[string]any {
		return map[string]any{"description": http.StatusText(status), "content": map[string]any{
			"application/problem+json": map[string]any{"schema": ref("Problem")}}}
	}
	paths := map[string]any{}
	for _, rt := range (&Controller{}).apiTable() {
		op := map[string]any{"operationId": rt.ID, "summary": rt.Summary}
		responses := map[string]any{}
		ok := map[string]any{"description": "OK"}
		switch {
		case rt.Stream:
			ok["content"] = map[string]any{"application/x-ndjson": map[string]any{
				"schema": map[string]any{"description": "one frame a line: output frames, then the last frame (done true)",
					"oneOf": []any{g.schema(reflect.TypeFor[outputFrame](), "OutputFrame", nil, nil), g.schema(reflect.TypeOf(rt.Response), "", nil, nil)}}}}
		case rt.ID == "openapi":
			ok["content"] = map[string]any{"application/json": map[string]any{"schema": map[string]any{"type": "object"}}}
		default:
			ok["content"] = map[string]any{"application/json": map[string]any{"schema": g.schema(reflect.TypeOf(rt.Response), "", nil, nil)}}
		}
		responses["200"] = ok
		if rt.Auth {
			op["security"] = []any{map[string]any{"bearer": []string{}}}
		} else {
			op["security"] = []any{}
		}
		for _, s := range rt.declared() {
			if s != 200 {
				responses[strconv.Itoa(s)] = problem(s)
			}
		}
		op["responses"] = responses
		if rt.Request != nil {
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{
				"schema": g.schema(reflect.TypeOf(rt.Request), rt.ID+"_request", rt.Hidden, rt.Required)}}}
		}
		item, _ := paths[rt.Path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[rt.Path] = item
		}
		item[strings.ToLower(rt.Method)] = op
	}
	return map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{
			"title":   "thermite harness API",
			"version": "1",
			"description": "What a worker agent's tools call, with its trial's token (Authorization: Bearer, the scheme in any case), " +
				"on the unix socket THERMITE_API_SOCKET (lanes and agents have no TCP; the rig's TCP listener is for a supervisor outside the roles). Every error is an RFC 9457 problem " +
				"with a stable code. A path the document lists with a method it lacks is answered 405 (code method_not_allowed, an Allow header); " +
				"any other path 404 (code no_route). A request body may hold only the fields its schema lists. " +
				"CONNECT host:port, with the token as Proxy-Authorization (Basic, the token the password; or Bearer), is the egress proxy to the rig's agent.egress: " +
				"200 and a tunnel, or 407 (no token), 403 (code egress_refused: not listed, or a refused address at dial time), 429, 502.",
		},
		"paths": paths,
		"components": map[string]any{
			"schemas":         g.schemas,
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}},
			"responses": map[string]any{
				"NoRoute":          problem(http.StatusNotFound),
				"MethodNotAllowed": problem(http.StatusMethodNotAllowed),
			},
		},
	}
}

func ref(name string) map[string]any {
	return map[string]any{"$ref": "#/components/schemas/" + name}
}

// schemaGen makes JSON Schemas (2020-12, as OpenAPI 3.1 takes them) of Go
// types from their JSON tags, each struct once under components.
type schemaGen struct {
	schemas map[string]any
}

// schema describes t; a struct becomes a named component (name, or its
// Go name) with no properties but its own, less hidden.
func (g *schemaGen) schema(t reflect.Type, name string, hidden, required []string) map[string]any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[time.Time]():
		return map[string]any{"type": "string", "format": "date-time"}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8:
		return map[string]any{"type": "string", "contentEncoding": "base64"}
	}
	switch t.Kind() {
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return map[string]any{"type": "integer"}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer", "minimum": 0}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": g.schema(t.Elem(), "", nil, nil)}
	case reflect.Map, reflect.Interface:
		return map[string]any{"type": "object"}
	}
	if name == "" {
		name = t.Name()
	}
	if _, done := g.schemas[name]; !done {
		g.schemas[name] = nil // a type that holds itself stops here
		props := map[string]any{}
		g.fields(t, hidden, props)
		s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
		if len(required) > 0 {
			s["required"] = required
		}
		g.schemas[name] = s
	}
	return ref(name)
}

// fields adds a struct's JSON fields to props, an embedded struct's as
// its own (encoding/json flattens them).
func (g *schemaGen) fields(t reflect.Type, hidden []string, props map[string]any) {
	for f := range t.Fields() {
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			g.fields(f.Type, hidden, props)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" || slices.Contains(hidden, name) {
			continue
		}
		if name == "" {
			name = f.Name
		}
		props[name] = g.schema(f.Type, "", nil, nil)
	}
}
