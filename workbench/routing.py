from sessions.routing import websocket_urlpatterns as session_sockets

websocket_urlpatterns = [*session_sockets]
