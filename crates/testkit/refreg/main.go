// refreg: an OCI registry with the referrers API (OCI distribution spec 1.1), for tests.
// go-containerregistry's pkg/registry, in memory, plain HTTP on the address given
// (127.0.0.1:PORT). Debian's docker-registry 2.8 has no referrers API; this is the
// registry the tests use for the referrers path. ci/cosign-tools.sh builds it from the
// Debian package golang-github-google-go-containerregistry-dev.
package main

import (
	"log"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/registry"
)

// locating adds the Location header the distribution spec asks for on the 201 of a PUT
// that ends a blob upload (.../blobs/uploads/<id>?digest=...) or stores a manifest
// (.../manifests/<reference>): ggcr's registry (0.20.7) sends none, and oci-client
// refuses such a blob upload (and, pushing a manifest by digest, panics).
type locating struct {
	http.ResponseWriter
	req *http.Request
}

func (w locating) WriteHeader(code int) {
	path := w.req.URL.Path
	if code == http.StatusCreated && w.req.Method == http.MethodPut && w.Header().Get("Location") == "" {
		if i := strings.Index(path, "/blobs/uploads/"); i >= 0 {
			w.Header().Set("Location", path[:i]+"/blobs/"+w.req.URL.Query().Get("digest"))
		} else if i := strings.Index(path, "/manifests/"); i >= 0 {
			w.Header().Set("Location", path[:i]+"/manifests/"+w.Header().Get("Docker-Content-Digest"))
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: refreg 127.0.0.1:PORT")
	}
	l, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	reg := registry.New(registry.WithReferrersSupport(true))
	log.Fatal(http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reg.ServeHTTP(locating{w, r}, r)
	})))
}
