from django.urls import path

from sessions.routing import websocket_urlpatterns as session_sockets
from workbench.ui.consumers import TimelineConsumer

websocket_urlpatterns = [
    *session_sockets,
    path("ws/ui/sessions/<str:session_id>/", TimelineConsumer.as_asgi()),
]
