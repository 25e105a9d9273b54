"""The embedded services: the Tansu broker (`embedded`) and the local stack (`stack`)."""
