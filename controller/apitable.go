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
			serve: func(w http.ResponseWriter, r *http.Request, rt *trialRT) { writeJSON(w, 200, c.infoOn(r, rt.t)) }},
	}
	// The file routes are the file helper's operations (lanefs.Ops): each
	// in the workspace, and those that change nothing in the research folder.
	for _, op := range lanefs.Ops {
		routes = append(routes, c.fileRoute("fs", op, ", in the workspace, as the lane", rootWorkspace))
	}
	for _, op := range lanefs.Ops {
		if !op.Changes {
			routes = append(routes, c.fileRoute("research", op, ", in the run's research folder (read-only)", rootResearch))
		}
	}
	search := c.fileRoute("research", lanefs.Grep.Op, "", rootResearch)
	search.Path, search.ID, search.Summary = "/v1/research/search", "research_search", "Search the run's research folder for a regular expression (grep)"
	routes = append(routes,
		search,
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
				c.execCapped(w, r, rt, req)
			}},
		apiRoute{Method: "POST", Path: "/v1/fetch", ID: "fetch", Summary: "Fetch a public web page, as the controller, into the run's research folder",
			Auth: true, Request: &FetchRequest{}, Required: []string{"url"}, Response: FetchResult{}, Statuses: []int{500, 502, 504}, serve: c.apiFetch},
	)
	return routes
}

// fileRoute is the route of a file helper operation in one root folder:
// POST /v1/GROUP/OP, its request less the root, which the API pins.
func (c *Controller) fileRoute(group string, op *lanefs.Op, where string, root int) apiRoute {
	return apiRoute{Method: "POST", Path: "/v1/" + group + "/" + op.Name, ID: group + "_" + op.Name, Summary: op.Summary + where,
		Auth: true, Request: op.NewRequest(), Hidden: []string{"root"}, Required: op.Required, Response: op.Response(), Statuses: fsStatuses,
		serve: func(w http.ResponseWriter, r *http.Request, rt *trialRT) { c.fsCall(w, r, rt, op, root) }}
}
