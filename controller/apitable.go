package controller

import (
	"net/http"

	"thermite/internal/lanefs"
)

// apiRoute is one route of the harness API: how it is served and how the
// OpenAPI document describes it. Both come from apiTable only.
type apiRoute struct {
	Method  string
	Path    string
	ID      string // the OpenAPI operationId
	Summary string
	// Auth: the route takes a trial's token. Every such route may also
	// answer authStatuses.
	Auth bool
	// Request is a pointer to the body's type, nil for no body; Hidden
	// are fields of that type the API refuses (the file helper's root).
	Request any
	Hidden  []string
	// Required are the fields a request must give.
	Required []string
	// Response is a value of the 200 answer's type; with Stream set the
	// answer is NDJSON, one ExecFrame a line.
	Response any
	Stream   bool
	// Statuses are the statuses the route answers besides 200 and
	// authStatuses, each as a problem.
	Statuses []int

	serve  func(http.ResponseWriter, *http.Request, *trialRT) // with Auth
	handle http.HandlerFunc                                   // without
}

// declared are every status the route answers: 200, its own, and
// authStatuses when it takes a token.
func (rt apiRoute) declared() []int {
	out := append([]int{200}, rt.Statuses...)
	if rt.Auth {
		out = append(out, authStatuses...)
	}
	return out
}

// authStatuses are what any route with a token may answer before its
// own work: a bad token or an ended trial (401), an unreadable or late
// body (400, 408), a body over its route's size (413), the token's share
// of requests or bytes (429), the API's (503), the decoy credential (403).
var authStatuses = []int{400, 401, 403, 408, 413, 429, 503}

// fsStatuses are what the trial's file helper answers: refused (403),
// missing (404), taken (409), too large (413), failed (500, 502).
var fsStatuses = []int{400, 403, 404, 409, 413, 500, 502}

// fsOps are the file tools: op, request, answer, and a summary.
var fsOps = []struct {
	op       string
	req, res any
	required []string
	summary  string
	write    bool
}{
	{"read", &lanefs.ReadRequest{}, lanefs.ReadResponse{}, []string{"path"}, "Read a file's bytes (base64), from offset, at most limit", false},
	{"write", &lanefs.WriteRequest{}, lanefs.WriteResponse{}, []string{"path", "data"}, "Write a file (data base64), creating it or replacing its content", true},
	{"edit", &lanefs.EditRequest{}, lanefs.EditResponse{}, []string{"path", "old"}, "Replace the one place old occurs in a file by new", true},
	{"list", &lanefs.ListRequest{}, lanefs.ListResponse{}, nil, "List a folder", false},
	{"stat", &lanefs.StatRequest{}, lanefs.StatResponse{}, []string{"path"}, "Describe one file, folder or symlink", false},
	{"delete", &lanefs.DeleteRequest{}, lanefs.DeleteResponse{}, []string{"path"}, "Delete a file, a symlink, or a folder (recursive for one with content)", true},
	{"mkdir", &lanefs.MkdirRequest{}, lanefs.MkdirResponse{}, []string{"path"}, "Make a folder", true},
	{"grep", &lanefs.GrepRequest{}, lanefs.GrepResponse{}, []string{"pattern"}, "Search files under a folder for a regular expression", false},
	{"find", &lanefs.FindRequest{}, lanefs.FindResponse{}, nil, "Find files under a folder whose names match a glob", false},
}

// apiTable is the harness API: every route it serves, the one place both
// the router (apiRoutes) and the document (OpenAPI) are made from.
func (c *Controller) apiTable() []apiRoute {
	routes := []apiRoute{
		{Method: "GET", Path: "/v1/openapi.json", ID: "openapi", Summary: "This document", Response: map[string]any{}, Statuses: []int{413},
			handle: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Write(openAPIDocument())
			}},
		{Method: "GET", Path: "/v1/trial", ID: "trial", Summary: "The trial the token belongs to", Auth: true, Response: TrialInfo{},
			serve: func(w http.ResponseWriter, r *http.Request, rt *trialRT) { writeJSON(w, 200, c.info(rt.t)) }},
	}
	for _, f := range fsOps {
		routes = append(routes, apiRoute{Method: "POST", Path: "/v1/fs/" + f.op, ID: "fs_" + f.op, Summary: f.summary + ", in the workspace, as the lane",
			Auth: true, Request: f.req, Hidden: []string{"root"}, Required: f.required, Response: f.res, Statuses: fsStatuses,
			serve: func(w http.ResponseWriter, r *http.Request, rt *trialRT) { c.fsCall(w, r, rt, f.op, rootWorkspace) }})
	}
	for _, f := range fsOps {
		if f.write {
			continue
		}
		routes = append(routes, apiRoute{Method: "POST", Path: "/v1/research/" + f.op, ID: "research_" + f.op, Summary: f.summary + ", in the run's research folder (read-only)",
			Auth: true, Request: f.req, Hidden: []string{"root"}, Required: f.required, Response: f.res, Statuses: fsStatuses,
			serve: func(w http.ResponseWriter, r *http.Request, rt *trialRT) { c.fsCall(w, r, rt, f.op, rootResearch) }})
	}
	routes = append(routes,
		apiRoute{Method: "POST", Path: "/v1/research/search", ID: "research_search", Summary: "Search the run's research folder for a regular expression (grep)",
			Auth: true, Request: &lanefs.GrepRequest{}, Hidden: []string{"root"}, Required: []string{"pattern"}, Response: lanefs.GrepResponse{}, Statuses: fsStatuses,
			serve: func(w http.ResponseWriter, r *http.Request, rt *trialRT) { c.fsCall(w, r, rt, "grep", rootResearch) }},
		apiRoute{Method: "POST", Path: "/v1/research/note", ID: "research_note", Summary: "Write a research note every lane of the run can read",
			Auth: true, Request: &NoteRequest{}, Required: []string{"body"}, Response: NoteResult{}, Statuses: []int{500}, serve: c.apiNote},
		apiRoute{Method: "POST", Path: "/v1/steps", ID: "step", Summary: "Record one step of the agent's work",
			Auth: true, Request: &StepRequest{}, Required: []string{"kind"}, Response: StepResult{}, serve: c.apiStep},
		apiRoute{Method: "POST", Path: "/v1/exec", ID: "exec", Summary: "Run a command as the lane in the workspace; its output streams as NDJSON frames",
			Auth: true, Request: &ExecRequest{}, Required: []string{"argv"}, Stream: true, Response: ExecFrame{},
			serve: func(w http.ResponseWriter, r *http.Request, rt *trialRT) {
				var req ExecRequest
				if !decode(w, r, c.cfg.API.MaxBodyBytes, &req) {
					return
				}
				c.execInTrial(w, r, rt, req)
			}},
		apiRoute{Method: "POST", Path: "/v1/fetch", ID: "fetch", Summary: "Fetch a public web page, as the controller, into the run's research folder",
			Auth: true, Request: &FetchRequest{}, Required: []string{"url"}, Response: FetchResult{}, Statuses: []int{500, 502, 504}, serve: c.apiFetch},
	)
	return routes
}
