package controller

import (
	"reflect"
	"testing"

	"thermite/internal/lanefs"
)

// TestFileRoutesAreTheHelpersOperations: the API's file routes are the
// file helper's operations, each with the operation's own request and
// answer types: POST /v1/fs/OP for every one, POST /v1/research/OP only
// for those that change nothing, and a changing one under research is no
// route at all (404): the research folder cannot be changed through the
// API.
func TestFileRoutesAreTheHelpersOperations(t *testing.T) {
	routes := map[string]apiRoute{}
	for _, rt := range (&Controller{}).apiTable() {
		routes[rt.Method+" "+rt.Path] = rt
	}
	_, h := testAPI()
	for _, op := range lanefs.Ops {
		for _, group := range []string{"fs", "research"} {
			rt, ok := routes["POST /v1/"+group+"/"+op.Name]
			if group == "research" && op.Changes {
				if ok {
					t.Errorf("%s changes files, yet the research folder has a route for it", op.Name)
				}
				if w := serveAPI(h, "POST", "/v1/research/"+op.Name, "Bearer x", "{}"); w.Code != 404 {
					t.Errorf("POST /v1/research/%s: %d, want 404", op.Name, w.Code)
				}
				continue
			}
			if !ok {
				t.Errorf("no route POST /v1/%s/%s", group, op.Name)
				continue
			}
			if reflect.TypeOf(rt.Request) != reflect.TypeOf(op.NewRequest()) || reflect.TypeOf(rt.Response) != reflect.TypeOf(op.Response()) {
				t.Errorf("%s: takes %T and answers %T", rt.Path, rt.Request, rt.Response)
			}
		}
	}
}
