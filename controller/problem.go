package controller

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
)

// Problem is every error answer of the controller's APIs, an RFC 9457
// problem detail (application/problem+json): Code is the stable,
// machine-readable name of what went wrong, Detail the one line for a
// person, and Type the code as a URI.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// problemType is the URI a problem's type is: one per code.
const problemType = "urn:thermite:problem:"

// The codes of problems the API answers besides those of the file helper
// (lanefs.Code*). A client may rely on them; they never change meaning.
const (
	CodeBadJSON          = "bad_json"           // the body is not the JSON the route takes
	CodeUnknownField     = "unknown_field"      // a field the route does not take
	CodeBadField         = "bad_field"          // a field of the wrong type or value
	CodeMissingField     = "missing_field"      // a field the route needs is absent
	CodeUnauthorized     = "unauthorized"       // no token, a wrong one, or an ended trial's
	CodeForbidden        = "forbidden"          // refused by policy
	CodeDecoySeen        = "decoy_seen"         // the request held the trial's decoy credential
	CodeNoRoute          = "no_route"           // no such path
	CodeMethodNotAllowed = "method_not_allowed" // the path takes other methods
	CodeBodyTimeout      = "body_timeout"       // the body did not arrive in time
	CodeConflict         = "conflict"
	CodeTooLarge         = "too_large" // a body, a record or a page over its limit
	CodeUnprocessable    = "unprocessable"
	CodeTooManyRequests  = "too_many_requests" // over the token's share
	CodeBusy             = "busy"              // over the whole API's share: try again
	CodeInternal         = "internal"
	CodeBadGateway       = "bad_gateway"   // the file helper or a fetched server failed
	CodeTimeout          = "timeout"       // a fetched server did not answer in time
	CodeFetchRefused     = "fetch_refused" // a fetch to a refused address or scheme
)

// statusCode is the code of a problem that has no more precise one.
func statusCode(status int) string {
	switch status {
	case 400:
		return CodeBadJSON
	case 401:
		return CodeUnauthorized
	case 403:
		return CodeForbidden
	case 404:
		return CodeNoRoute
	case 405:
		return CodeMethodNotAllowed
	case 407:
		return CodeUnauthorized
	case 408:
		return CodeBodyTimeout
	case 409:
		return CodeConflict
	case 413:
		return CodeTooLarge
	case 422:
		return CodeUnprocessable
	case 429:
		return CodeTooManyRequests
	case 502:
		return CodeBadGateway
	case 503:
		return CodeBusy
	case 504:
		return CodeTimeout
	}
	return CodeInternal
}

// writeProblem answers an error as an RFC 9457 problem.
func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(Problem{Type: problemType + code, Title: http.StatusText(status), Status: status, Detail: detail, Code: code})
}

// decodeErr is a refused body: its status, code and one line.
type decodeErr struct {
	status int
	code   string
	msg    string
}

// jsonFields are the names a request type takes, as its JSON tags say,
// less the hidden ones.
func jsonFields(t reflect.Type, hidden []string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var out []string
	if t.Kind() != reflect.Struct {
		return nil
	}
	for f := range t.Fields() {
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			out = append(out, jsonFields(f.Type, hidden)...)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if !slices.Contains(hidden, name) {
			out = append(out, name)
		}
	}
	return out
}

// decodeStrict reads a JSON object into v: within limit bytes, only the
// fields v's type has less hidden ones, named exactly (encoding/json alone
// would take "Root" for "root"), and nothing after it. Its refusals name
// fields and JSON types, never the server's own type names.
func decodeStrict(body io.Reader, limit int64, v any, hidden []string) *decodeErr {
	raw, err := io.ReadAll(io.LimitReader(body, limit+1))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig) || int64(len(raw)) > limit:
		return &decodeErr{413, CodeTooLarge, fmt.Sprintf("the body is over the %d-byte limit", limit)}
	case err != nil:
		return &decodeErr{400, CodeBadJSON, "reading the body failed"}
	}
	fields := jsonFields(reflect.TypeOf(v), hidden)
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil || keys == nil {
		why := "got null"
		if err != nil {
			why = jsonProblem(err)
		}
		return &decodeErr{400, CodeBadJSON, "the body must be one JSON object: " + why}
	}
	for k := range keys {
		if !slices.Contains(fields, k) {
			return &decodeErr{400, CodeUnknownField, fmt.Sprintf("field %q is not one this route takes (it takes: %s)", k, strings.Join(fields, ", "))}
		}
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &decodeErr{400, CodeBadField, jsonProblem(err)}
	}
	return nil
}

// jsonProblem says what is wrong with a body in the words of JSON:
// field names and JSON types, never the server's own type names.
func jsonProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var b64 base64.CorruptInputError
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "the body ends early"
	case errors.As(err, &syn):
		return fmt.Sprintf("not JSON at byte %d", syn.Offset)
	case errors.As(err, &typ) && typ.Field == "":
		return fmt.Sprintf("got a JSON %s, want an object", typ.Value)
	case errors.As(err, &typ):
		return fmt.Sprintf("field %s: got a JSON %s, want %s", typ.Field, typ.Value, jsonKind(typ.Type))
	case errors.As(err, &b64):
		return fmt.Sprintf("a base64 field is not base64 (at byte %d of its value)", int64(b64))
	}
	return "not the JSON this route takes"
}

// jsonKind names what a Go type is in JSON.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a base64 string"
		}
		return "an array"
	}
	return "an object"
}
