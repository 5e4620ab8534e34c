"""The /v1 routers; each module has one `router` (an APIRouter with the auth dependency on every route)."""
