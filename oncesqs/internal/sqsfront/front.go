// Package sqsfront translates the AWS JSON 1.0 protocol that
// aws-sdk-go-v2's service/sqs speaks to SQS's query protocol, the only
// one goaws 0.4.5 speaks, and goaws's XML answers back to JSON. It is a
// test kit, minimal: it knows the operations oncesqs and its tests call.
//
// Limits (what a test through it does not exercise of real SQS):
//   - operations: CreateQueue, GetQueueUrl, GetQueueAttributes,
//     SetQueueAttributes, SendMessage, ReceiveMessage, DeleteMessage,
//     DeleteMessageBatch, ChangeMessageVisibility and
//     ChangeMessageVisibilityBatch (which goaws lacks: sent one entry at a
//     time); any other is answered UnsupportedOperation;
//   - message attributes: String, Number and Binary values; no list
//     values; ReceiveMessage returns those MessageAttributeNames asks for
//     ("All", ".*", names and "prefix.*"), and then no
//     MD5OfMessageAttributes when it left some out;
//   - system attributes: what goaws returns (ApproximateReceiveCount is
//     always 1 there; no MessageGroupId, SequenceNumber or
//     MessageDeduplicationId);
//   - ReceiveMessage's VisibilityTimeout is ignored by goaws (the queue's
//     applies);
//   - errors: goaws's codes mapped onto the JSON error types of the
//     SDK (QueueDoesNotExist, MessageNotInflight, ReceiptHandleIsInvalid),
//     the rest InvalidParameterValue;
//   - DeleteMessageBatch: goaws reports no failed entry; the front reports
//     every entry goaws did not list as deleted as ReceiptHandleIsInvalid.
package sqsfront

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// Front is an http.Handler that serves the SQS JSON protocol in front of a
// goaws server.
type Front struct {
	target string // goaws's base URL
	client *http.Client
}

// New returns a front forwarding to the goaws server at target
// ("http://127.0.0.1:4100").
func New(target string) *Front {
	return &Front{target: strings.TrimSuffix(target, "/"), client: &http.Client{}}
}

type apiError struct {
	status int
	typ    string // the JSON error type (QueueDoesNotExist)
	query  string // the query protocol's code
	msg    string
}

func (e *apiError) Error() string { return e.typ + ": " + e.msg }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "InvalidParameterValue", query: "InvalidParameterValue", msg: fmt.Sprintf(format, args...)}
}

// ServeHTTP answers one JSON call.
func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	op, ok := strings.CutPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
	if !ok || r.Method != http.MethodPost {
		writeError(w, &apiError{status: http.StatusBadRequest, typ: "UnsupportedOperation", query: "AWS.SimpleQueueService.UnsupportedOperation", msg: "not an SQS JSON call"})
		return
	}
	var in map[string]any
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil && err != io.EOF {
		writeError(w, badRequest("decode the request: %v", err))
		return
	}
	out, aerr := f.call(r, op, in)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	_ = json.NewEncoder(w).Encode(out)
}

func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("X-Amzn-Query-Error", e.query+";Sender")
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.sqs#" + e.typ, "message": e.msg})
}

func (f *Front) call(r *http.Request, op string, in map[string]any) (any, *apiError) {
	form := url.Values{"Action": {op}, "Version": {"2012-11-05"}}
	str := func(name string) {
		if v, ok := in[name]; ok && v != nil {
			form.Set(name, scalar(v))
		}
	}
	switch op {
	case "CreateQueue":
		str("QueueName")
		queueAttributes(form, in["Attributes"])
		var x struct {
			Result struct{ QueueUrl string } `xml:"CreateQueueResult"`
		}
		if err := f.post(r, form, &x); err != nil {
			return nil, err
		}
		return map[string]any{"QueueUrl": x.Result.QueueUrl}, nil
	case "GetQueueUrl":
		str("QueueName")
		var x struct {
			Result struct{ QueueUrl string } `xml:"GetQueueUrlResult"`
		}
		if err := f.post(r, form, &x); err != nil {
			return nil, err
		}
		return map[string]any{"QueueUrl": x.Result.QueueUrl}, nil
	case "GetQueueAttributes":
		str("QueueUrl")
		for i, name := range list(in["AttributeNames"]) {
			form.Set("AttributeName."+strconv.Itoa(i+1), name)
		}
		var x struct {
			Result struct {
				Attrs []struct{ Name, Value string } `xml:"Attribute"`
			} `xml:"GetQueueAttributesResult"`
		}
		if err := f.post(r, form, &x); err != nil {
			return nil, err
		}
		attrs := map[string]string{}
		for _, a := range x.Result.Attrs {
			attrs[a.Name] = a.Value
		}
		return map[string]any{"Attributes": attrs}, nil
	case "SetQueueAttributes":
		str("QueueUrl")
		queueAttributes(form, in["Attributes"])
		return map[string]any{}, f.post(r, form, nil)
	case "SendMessage":
		for _, name := range []string{"QueueUrl", "MessageBody", "DelaySeconds", "MessageGroupId", "MessageDeduplicationId"} {
			str(name)
		}
		if err := messageAttributes(form, in["MessageAttributes"]); err != nil {
			return nil, err
		}
		var x struct {
			Result struct {
				MD5OfMessageAttributes, MD5OfMessageBody, MessageId, SequenceNumber string
			} `xml:"SendMessageResult"`
		}
		if err := f.post(r, form, &x); err != nil {
			return nil, err
		}
		out := map[string]any{"MessageId": x.Result.MessageId, "MD5OfMessageBody": x.Result.MD5OfMessageBody}
		if x.Result.MD5OfMessageAttributes != "" {
			out["MD5OfMessageAttributes"] = x.Result.MD5OfMessageAttributes
		}
		if x.Result.SequenceNumber != "" {
			out["SequenceNumber"] = x.Result.SequenceNumber
		}
		return out, nil
	case "ReceiveMessage":
		for _, name := range []string{"QueueUrl", "MaxNumberOfMessages", "WaitTimeSeconds", "VisibilityTimeout"} {
			str(name)
		}
		return f.receive(r, form, list(in["MessageAttributeNames"]), append(list(in["AttributeNames"]), list(in["MessageSystemAttributeNames"])...))
	case "DeleteMessage":
		str("QueueUrl")
		str("ReceiptHandle")
		return map[string]any{}, f.post(r, form, nil)
	case "DeleteMessageBatch":
		str("QueueUrl")
		entries := entries(in["Entries"])
		for i, e := range entries {
			form.Set(fmt.Sprintf("DeleteMessageBatchRequestEntry.%d.Id", i+1), scalar(e["Id"]))
			form.Set(fmt.Sprintf("DeleteMessageBatchRequestEntry.%d.ReceiptHandle", i+1), scalar(e["ReceiptHandle"]))
		}
		var x struct {
			Result struct {
				Entry []struct{ Id string } `xml:"DeleteMessageBatchResultEntry"`
			} `xml:"DeleteMessageBatchResult"`
		}
		if err := f.post(r, form, &x); err != nil {
			return nil, err
		}
		deleted := map[string]bool{}
		for _, e := range x.Result.Entry {
			deleted[e.Id] = true
		}
		ok, failed := []any{}, []any{}
		for _, e := range entries {
			id := scalar(e["Id"])
			if deleted[id] {
				ok = append(ok, map[string]string{"Id": id})
			} else {
				failed = append(failed, map[string]any{"Id": id, "Code": "ReceiptHandleIsInvalid", "SenderFault": true, "Message": "the message is not in flight under this receipt handle"})
			}
		}
		return map[string]any{"Successful": ok, "Failed": failed}, nil
	case "ChangeMessageVisibility":
		for _, name := range []string{"QueueUrl", "ReceiptHandle", "VisibilityTimeout"} {
			str(name)
		}
		return map[string]any{}, f.post(r, form, nil)
	case "ChangeMessageVisibilityBatch":
		ok, failed := []any{}, []any{}
		form.Set("Action", "ChangeMessageVisibility")
		form.Set("QueueUrl", scalar(in["QueueUrl"]))
		for _, e := range entries(in["Entries"]) {
			form.Set("ReceiptHandle", scalar(e["ReceiptHandle"]))
			form.Set("VisibilityTimeout", scalar(e["VisibilityTimeout"]))
			id := scalar(e["Id"])
			if err := f.post(r, form, nil); err != nil {
				failed = append(failed, map[string]any{"Id": id, "Code": err.typ, "SenderFault": true, "Message": err.msg})
			} else {
				ok = append(ok, map[string]string{"Id": id})
			}
		}
		return map[string]any{"Successful": ok, "Failed": failed}, nil
	}
	return nil, &apiError{status: http.StatusBadRequest, typ: "UnsupportedOperation", query: "AWS.SimpleQueueService.UnsupportedOperation", msg: op + " is not supported by the test front"}
}

func (f *Front) receive(r *http.Request, form url.Values, attrNames, sysNames []string) (any, *apiError) {
	var x struct {
		Result struct {
			Message []struct {
				MessageId, ReceiptHandle, MD5OfBody, Body, MD5OfMessageAttributes string
				MessageAttribute                                                  []struct {
					Name  string
					Value struct{ DataType, StringValue, BinaryValue string }
				}
				Attribute []struct{ Name, Value string }
			}
		} `xml:"ReceiveMessageResult"`
	}
	if err := f.post(r, form, &x); err != nil {
		return nil, err
	}
	msgs := []any{}
	for _, m := range x.Result.Message {
		out := map[string]any{"MessageId": m.MessageId, "ReceiptHandle": m.ReceiptHandle, "MD5OfBody": m.MD5OfBody, "Body": m.Body}
		attrs, all := map[string]any{}, true
		for _, a := range m.MessageAttribute {
			if !wanted(attrNames, a.Name) {
				all = false
				continue
			}
			v := map[string]any{"DataType": a.Value.DataType}
			if a.Value.BinaryValue != "" {
				v["BinaryValue"] = a.Value.BinaryValue // base64 in both protocols
			} else {
				v["StringValue"] = a.Value.StringValue
			}
			attrs[a.Name] = v
		}
		if len(attrs) > 0 {
			out["MessageAttributes"] = attrs
			if all && m.MD5OfMessageAttributes != "" {
				out["MD5OfMessageAttributes"] = m.MD5OfMessageAttributes
			}
		}
		sys := map[string]string{}
		for _, a := range m.Attribute {
			if wanted(sysNames, a.Name) {
				sys[a.Name] = a.Value
			}
		}
		if len(sys) > 0 {
			out["Attributes"] = sys
		}
		msgs = append(msgs, out)
	}
	return map[string]any{"Messages": msgs}, nil
}

// wanted reports whether names (as ReceiveMessage takes them) ask for name.
func wanted(names []string, name string) bool {
	for _, n := range names {
		if n == "All" || n == ".*" || n == name {
			return true
		}
		if p, ok := strings.CutSuffix(n, ".*"); ok && strings.HasPrefix(name, p+".") {
			return true
		}
	}
	return false
}

// post sends form to goaws and decodes its XML answer into out (when not
// nil), or turns its error into the JSON one.
func (f *Front) post(r *http.Request, form url.Values, out any) *apiError {
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, f.target+"/", strings.NewReader(form.Encode()))
	if err != nil {
		return badRequest("%v", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := f.client.Do(req)
	if err != nil {
		return &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailable", query: "ServiceUnavailable", msg: err.Error()}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailable", query: "ServiceUnavailable", msg: err.Error()}
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Type, Code, Message string }
		}
		_ = xml.Unmarshal(body, &e)
		return goawsError(resp.StatusCode, e.Error.Code, e.Error.Type, e.Error.Message, body)
	}
	if out == nil {
		return nil
	}
	if err := xml.Unmarshal(body, out); err != nil {
		return &apiError{status: http.StatusInternalServerError, typ: "InternalError", query: "InternalError", msg: fmt.Sprintf("decode goaws's answer: %v", err)}
	}
	return nil
}

func goawsError(status int, code, typ, msg string, body []byte) *apiError {
	switch {
	case code == "AWS.SimpleQueueService.NonExistentQueue":
		return &apiError{status: http.StatusBadRequest, typ: "QueueDoesNotExist", query: code, msg: msg}
	case typ == "MessageNotInFlight":
		return &apiError{status: http.StatusBadRequest, typ: "MessageNotInflight", query: "AWS.SimpleQueueService.MessageNotInflight", msg: msg}
	case status == http.StatusNotFound:
		return &apiError{status: http.StatusBadRequest, typ: "ReceiptHandleIsInvalid", query: "ReceiptHandleIsInvalid", msg: msg}
	case code == "":
		return &apiError{status: http.StatusBadRequest, typ: "InvalidParameterValue", query: "InvalidParameterValue", msg: strings.TrimSpace(string(body))}
	}
	return &apiError{status: http.StatusBadRequest, typ: "InvalidParameterValue", query: code, msg: msg}
}

func queueAttributes(form url.Values, v any) {
	m, _ := v.(map[string]any)
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	for i, name := range names {
		form.Set(fmt.Sprintf("Attribute.%d.Name", i+1), name)
		form.Set(fmt.Sprintf("Attribute.%d.Value", i+1), scalar(m[name]))
	}
}

func messageAttributes(form url.Values, v any) *apiError {
	m, _ := v.(map[string]any)
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	for i, name := range names {
		a, _ := m[name].(map[string]any)
		p := fmt.Sprintf("MessageAttribute.%d.", i+1)
		form.Set(p+"Name", name)
		form.Set(p+"Value.DataType", scalar(a["DataType"]))
		switch {
		case a["StringValue"] != nil:
			form.Set(p+"Value.StringValue", scalar(a["StringValue"]))
		case a["BinaryValue"] != nil:
			form.Set(p+"Value.BinaryValue", scalar(a["BinaryValue"]))
		default:
			return badRequest("message attribute %s: list values are not supported by the test front", name)
		}
	}
	return nil
}

func scalar(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(v)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

func list(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, x := range l {
		out = append(out, scalar(x))
	}
	return out
}

func entries(v any) []map[string]any {
	l, _ := v.([]any)
	out := make([]map[string]any, 0, len(l))
	for _, x := range l {
		m, _ := x.(map[string]any)
		out = append(out, m)
	}
	return out
}
