"""The respond role: the query responder (`responder`) and its HTTP views (`http`)."""
