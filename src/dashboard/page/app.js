new EventSource('/api/events');
