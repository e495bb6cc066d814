# stdout is the body; a non-zero exit fails the download with stderr's tail as the reason.
exec curl --silent --show-error --fail --max-time 30 -- "$1"
