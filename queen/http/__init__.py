"""Queen's HTTP/1.1 layer on h11: connections, routes, codecs and the one error mapping."""
