// Command testserver is what the real cluster's test pods serve behind a Service, so that
// kube-apiserver's pod proxy, service proxy, admission webhooks and aggregated APIs all have
// a real backend to reach through the egress selector:
//
//   - HTTP on :8080: GET /bytes?n=N answers N bytes of a pattern the test computes too (a
//     byte-for-byte check of what the proxy subresources carry); any other path answers
//     "testserver NODE: PATH" (which node's pod answered).
//   - HTTPS on :8443 (TLS_CERT and TLS_KEY, made by the test): POST /validate is a
//     validating admission webhook that denies objects whose name starts with "denied-"
//     ("denied by the webhook on NODE") and allows the rest; /apis/bridgehead.test/v1 is the
//     discovery document of an aggregated API with one cluster-wide resource, greetings,
//     whose list names the node; /healthz answers ok.
//
// NODE comes from the environment (the downward API's spec.nodeName).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
)

// group is the aggregated API's group; version its only version.
const (
	group   = "bridgehead.test"
	version = "v1"
)

// maxBytes bounds /bytes, so a bad query cannot make the pod allocate or send without end.
const maxBytes = 64 << 20

func main() {
	node := os.Getenv("NODE")
	cert, key := os.Getenv("TLS_CERT"), os.Getenv("TLS_KEY")
	if node == "" || cert == "" || key == "" {
		log.Fatal("testserver: NODE, TLS_CERT and TLS_KEY must be set")
	}
	plain := http.NewServeMux()
	plain.HandleFunc("/bytes", servePattern)
	plain.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "testserver %s: %s\n", node, r.URL.Path)
	})
	secure := http.NewServeMux()
	secure.HandleFunc("/validate", func(w http.ResponseWriter, r *http.Request) {
		validate(w, r, node)
	})
	secure.HandleFunc("/apis/"+group+"/"+version, discovery)
	secure.HandleFunc("/apis/"+group+"/"+version+"/greetings", func(w http.ResponseWriter, r *http.Request) {
		greetings(w, node)
	})
	secure.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	errs := make(chan error, 2)
	go func() { errs <- http.ListenAndServe(":8080", plain) }()
	go func() { errs <- http.ListenAndServeTLS(":8443", cert, key, secure) }()
	log.Printf("testserver on %s serving :8080 and :8443", node)
	log.Fatal(<-errs)
}

// pattern is byte i of /bytes: every byte value, the same formula as the test's.
func pattern(i uint32) byte {
	return byte((i * 2654435761) >> 13)
}

func servePattern(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.Atoi(r.URL.Query().Get("n"))
	if err != nil || n < 0 || n > maxBytes {
		http.Error(w, fmt.Sprintf("n must be a count of bytes from 0 to %d", maxBytes), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(n))
	out := bufio.NewWriterSize(w, 64<<10)
	for i := 0; i < n; i++ {
		if out.WriteByte(pattern(uint32(i))) != nil {
			return
		}
	}
	_ = out.Flush()
}

// review is the part of an admission.k8s.io/v1 AdmissionReview the webhook reads and writes.
type review struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    *struct {
		UID  string `json:"uid"`
		Name string `json:"name"`
	} `json:"request,omitempty"`
	Response *reviewResponse `json:"response,omitempty"`
}

type reviewResponse struct {
	UID     string  `json:"uid"`
	Allowed bool    `json:"allowed"`
	Status  *status `json:"status,omitempty"`
}

type status struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func validate(w http.ResponseWriter, r *http.Request, node string) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	var in review
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 3<<20)).Decode(&in); err != nil || in.Request == nil {
		http.Error(w, "not an AdmissionReview with a request", http.StatusBadRequest)
		return
	}
	answer := &reviewResponse{UID: in.Request.UID, Allowed: true}
	if strings.HasPrefix(in.Request.Name, "denied-") {
		answer.Allowed = false
		answer.Status = &status{Code: http.StatusForbidden, Message: "denied by the webhook on " + node}
	}
	writeJSON(w, review{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview", Response: answer})
}

func discovery(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, map[string]any{
		"kind":         "APIResourceList",
		"apiVersion":   "v1",
		"groupVersion": group + "/" + version,
		"resources": []map[string]any{{
			"name": "greetings", "singularName": "greeting", "namespaced": false,
			"kind": "Greeting", "verbs": []string{"list"},
		}},
	})
}

func greetings(w http.ResponseWriter, node string) {
	writeJSON(w, map[string]any{
		"kind":       "GreetingList",
		"apiVersion": group + "/" + version,
		"metadata":   map[string]any{},
		"items": []map[string]any{{
			"kind": "Greeting", "apiVersion": group + "/" + version,
			"metadata": map[string]any{"name": "hello-from-" + node},
		}},
	})
}

func writeJSON(w http.ResponseWriter, body any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(body); err != nil {
		log.Printf("writing an answer: %v", err)
	}
}
