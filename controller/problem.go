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
